"""Components that misbehave on purpose (actor processes import them by name): a loss that fails inside the
trainer actor, and a reward that never tells completions apart."""

import torch


class BoomLoss(torch.nn.Module):
    """Passes the start-up probe (a made-up batch of 2 sequences, apps/preflight.py) and raises on the first real
    batch, inside the trainer's process: what a bug that only real data triggers looks like."""

    def forward(self, logprobs, advantages, padding_mask):
        if logprobs.shape[0] <= 2:
            return (logprobs * advantages).sum()
        raise RuntimeError("boom at step 1")


def flat_reward(prompt: str, response: str, target: str) -> float:
    return 0.0
