"""A trainer with two extra endpoints, so a test can move its weights and ask what they say greedily. (A module of
its own: Monarch's actor processes import it by name.)"""

from __future__ import annotations

import torch
from monarch.actor import endpoint

from forge_exp.actors.trainer import Trainer
from forge_exp.models.generate import generate


class GreedyTrainer(Trainer):
    @endpoint
    async def perturb(self, scale: float) -> int:
        """Stands in for a training step: every weight moves, the version goes up by one."""
        with torch.no_grad():
            for p in self.engine.model.parameters():
                p.add_(torch.randn_like(p) * scale)
        self.version += 1
        return self.version

    @endpoint
    async def greedy(self, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
        tok = self.engine.tokenizer
        rows = [tok.encode(p) for p in prompts]
        outs = generate(self.engine.model, rows, max_new_tokens=max_new_tokens, temperature=0.0,
                        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
        return [o.token_ids for o in outs]
