"""Reference model service: frozen initial policy; logprobs of responses for the KL term (only when beta > 0)."""

from __future__ import annotations

import torch
from monarch.actor import Actor, endpoint

from forge_exp.actors.placement import place
from forge_exp.models.logprobs import sequence_logprobs
from forge_exp.rl.types import TrainBatch
from forge_exp.runtime.build import build


class ReferenceModel(Actor):
    def __init__(self, model, init_path: str | None, temperature: float, share_prompts: bool = False, *, devices,
                 threads):
        self.device = place(devices, threads)
        self.model = build(model, "model").loading(init_path).build(self.device)
        self.model.eval().requires_grad_(False)
        self.temperature, self.share_prompts = temperature, share_prompts  # (trainer.share_prompts)

    @endpoint
    async def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """[B, R] logprobs of batch.response_ids under the reference model (0 on padding)."""
        with torch.no_grad():
            lp, _ = sequence_logprobs(
                self.model,
                batch.prompt_ids.to(self.device),
                batch.prompt_mask.to(self.device),
                batch.response_ids.to(self.device),
                batch.response_mask.to(self.device),
                self.temperature,
                share_prompts=self.share_prompts,
            )
        return lp.cpu()
