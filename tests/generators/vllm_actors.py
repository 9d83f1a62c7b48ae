"""A trainer a test can move (ProbeTrainer's perturb) and ask what its weights say greedily. (A module of its own:
Monarch's actor processes import it by name.)"""

from __future__ import annotations

from monarch.actor import endpoint

from forge_exp.models.generate import generate
from tests.runtime.weight_sync_actors import ProbeTrainer


class GreedyTrainer(ProbeTrainer):  # perturb(scale): every weight moves, the version goes up by one
    @endpoint
    async def greedy(self, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
        tok = self.engine.tokenizer
        rows = [tok.encode(p) for p in prompts]
        outs = generate(self.engine.model, rows, max_new_tokens=max_new_tokens, temperature=0.0,
                        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
        return [o.token_ids for o in outs]
