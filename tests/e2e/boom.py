"""Components that misbehave on purpose (actor processes import them by name): a loss that fails inside the
trainer actor, and a reward that never tells completions apart."""

import torch


class BoomLoss(torch.nn.Module):
    def forward(self, logprobs, advantages, padding_mask):
        raise RuntimeError("boom at step 1")


def flat_reward(prompt: str, response: str, target: str) -> float:
    return 0.0
