"""What every training loop does around its steps: which steps run (a resumed run continues after its checkpoint),
the evaluation at step 0 (logged once: a resumed run reads it back), logging, the checkpoint and evaluation cadence,
the progress bar."""

from __future__ import annotations

from typing import Awaitable, Callable

from tqdm.auto import tqdm

from forge_exp.driver.checkpoint import ResumeState, save_checkpoint
from forge_exp.runtime.services import Service
from forge_exp.tracking.mlflow import Tracker

FLUSH_EVERY = 10  # steps between the tracker's flushes


class Steps:
    """Steps first..total of a loop named `name`. `snapshot` returns what a checkpoint holds besides the trainer's
    weights and optimizer (GRPO's loop.json), None for nothing."""

    def __init__(self, name: str, total: int, tracker: Tracker, trainer: Service, checkpoint, eval_every: int,
                 progress: bool, resume: ResumeState | None = None,
                 snapshot: Callable[[], Awaitable[dict]] | None = None):
        self.total, self.tracker, self.trainer, self.ckpt = total, tracker, trainer, checkpoint
        self.eval_every, self.resume, self.snapshot = eval_every, resume, snapshot
        self.first = resume.step + 1 if resume else 1
        self.saved = self.first - 1 if resume else 0  # the newest checkpoint's step (0: none)
        self.name, self.progress, self.bar = name, progress, None

    def __iter__(self):
        """The steps to run; the progress bar starts with them."""
        self.bar = tqdm(total=self.total, initial=self.first - 1, desc=self.name, disable=not self.progress,
                        dynamic_ncols=True)
        return iter(range(self.first, self.total + 1))

    async def opening(self, evaluate: Callable[[], Awaitable[dict[str, float]]], key: str | None) -> dict[str, float]:
        """The evaluation at step 0: run and logged, or, on a resume, `key` as the interrupted run logged it."""
        if self.resume:
            return {key: self.tracker.metric_at(key, step=0)} if key else {}
        metrics = await evaluate()
        self.tracker.log_metrics(metrics, step=0)
        return metrics

    def checkpoint_due(self, step: int) -> bool:
        return bool(self.ckpt.every) and step % self.ckpt.every == 0

    def eval_due(self, step: int) -> bool:
        """Every eval.every steps, but not at the last: the loop's closing evaluation is that one."""
        return bool(self.eval_every) and step % self.eval_every == 0 and step != self.total

    async def checkpoint(self, step: int) -> None:
        loop = await self.snapshot() if self.snapshot else None
        await save_checkpoint(self.ckpt, self.trainer, self.tracker, step, loop)
        self.saved = step

    async def logged(self, step: int, metrics: dict[str, float]) -> None:
        """Log the step's metrics, and checkpoint it when one is due."""
        self.tracker.log_metrics(metrics, step=step)
        if step % FLUSH_EVERY == 0:
            self.tracker.flush()
        if self.checkpoint_due(step):
            await self.checkpoint(step)

    def advance(self, **postfix) -> None:
        self.bar.update(1)
        self.bar.set_postfix(**postfix)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
