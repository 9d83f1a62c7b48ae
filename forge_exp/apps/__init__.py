"""The loops. `run_app` picks one from the config: GRPO-family algorithms share apps/grpo.py."""

from __future__ import annotations


async def run_app(config, runtime, tracker, resume=None) -> dict[str, float]:
    from forge_exp.apps import grpo

    handles = await grpo.build(config, runtime, resume)
    if handles.warm_start:
        tracker.log_metrics(handles.warm_start, step=0)
    summary = await grpo.train(config, handles, tracker, resume)
    return {**handles.warm_start, **summary}
