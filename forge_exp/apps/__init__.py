"""The loops. `run_app` picks one from the config: `mode=eval` → apps/eval.py, else the loop the algorithm's
schema names (its `app`): apps/sft.py for `algorithm=sft`, apps/grpo.py for the GRPO family."""

from __future__ import annotations

from importlib import import_module


async def run_app(config, runtime, tracker, resume=None) -> dict[str, float]:
    app = "eval" if config.mode == "eval" else config.algorithm.app
    run = _grpo if app == "grpo" else import_module(f"forge_exp.apps.{app}").run
    return await run(config, runtime, tracker, resume)


async def _grpo(config, runtime, tracker, resume) -> dict[str, float]:
    from forge_exp.apps import grpo

    handles = await grpo.build(config, runtime, resume)
    if handles.warm_start:
        tracker.log_metrics(handles.warm_start, step=0)
    summary = await grpo.train(handles, tracker, resume)
    return {**handles.warm_start, **summary}
