"""The loops. `run_app` picks one from the config: `mode=eval` → apps/eval.py, `algorithm=sft` → apps/sft.py,
every other algorithm (the GRPO family) → apps/grpo.py."""

from __future__ import annotations


async def run_app(config, runtime, tracker, resume=None) -> dict[str, float]:
    from forge_exp.config.algorithm import SFTAlgorithm

    if config.mode == "eval":
        from forge_exp.apps import eval as app
    elif isinstance(config.algorithm, SFTAlgorithm):
        from forge_exp.apps import sft as app
    else:
        return await _grpo(config, runtime, tracker, resume)
    return await app.run(config, runtime, tracker, resume)


async def _grpo(config, runtime, tracker, resume) -> dict[str, float]:
    from forge_exp.apps import grpo

    handles = await grpo.build(config, runtime, resume)
    if handles.warm_start:
        tracker.log_metrics(handles.warm_start, step=0)
    summary = await grpo.train(handles, tracker, resume)
    return {**handles.warm_start, **summary}
