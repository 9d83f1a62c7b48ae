"""Components that are wrong on purpose, for tests/faults (service processes import them by name)."""

import torch


class VectorLoss(torch.nn.Module):
    """Returns one value per token instead of a scalar."""

    def forward(self, logprobs, advantages, padding_mask):
        return -(logprobs * advantages)


class NanLoss(torch.nn.Module):
    def forward(self, logprobs, advantages, padding_mask):
        return (logprobs * advantages).sum() * float("nan")


class ConstantLoss(torch.nn.Module):
    """Does not depend on the policy: a gradient of zero, forever."""

    def forward(self, logprobs, advantages, padding_mask):
        return torch.tensor(1.0)


class RaisingLoss(torch.nn.Module):
    """A shape bug: [B, T] against [T, B]."""

    def forward(self, logprobs, advantages, padding_mask):
        return (logprobs @ logprobs).sum()


def broken_reward(prompt: str, response: str, target: str) -> float:
    """Raises on every call (a reward that was never run before the job)."""
    return len(response) + target  # TypeError: int + str


class InfLoss(torch.nn.Module):
    """GRPO's surrogate plus +inf once a batch has more than the 2 sequences of the CLI's test batch: finite there,
    +inf in training, with the surrogate's (finite) gradient."""

    def forward(self, logprobs, advantages, padding_mask):
        core = -(logprobs * advantages * padding_mask).sum() / padding_mask.sum()
        return core + (float("inf") if logprobs.shape[0] > 2 else 0.0)


def huge_reward(prompt: str, response: str, target: str) -> float:
    """A reward of ±1e308: finite, but no mean or advantage of it is."""
    return 1e308 if response.strip() == target else -1e308


class NeedsAJudge:
    """A reward class whose constructor fails on this machine (a judge model it cannot load)."""

    def __init__(self):
        raise RuntimeError("no judge model on this machine")

    def __call__(self, prompt: str, response: str, target: str) -> float:
        return 0.0
