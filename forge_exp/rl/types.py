"""The data that flows through one GRPO step, defined once.

    prompt ─▶ Completion (generator) ─▶ Group (+ rewards) ─▶ Episode (+ advantage) ─▶ TrainBatch (collated tensors)

A multi-turn episode (forge_exp/envs/) is one Completion too: `token_ids` holds every token after the prompt, the
model's turns and the environment's insertions (tool results, user turns) in order, and `loss_mask` tells them apart.
Only the model's tokens are trained on and enter the behaviour/reference ratios; the environment's are context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only TrainBatch holds tensors, and config validation reads Problem: no torch import for it
    import torch


@dataclass
class Problem:
    """One prompt of a task: what the model sees and what the reward checks against."""

    prompt: str  # text given to the tokenizer (already formatted with any chat template)
    target: str  # the reference answer a reward function compares with
    question: str = ""  # the raw question, before formatting (for logs)
    task: str = ""  # which task of a mix it comes from ("" for a single-task source): per-task metrics
    # what the task's own verifier reads besides the target (a reasoning-gym entry: question, answer, metadata);
    # a reward function that takes a `problem` keyword receives the whole Problem (rewards/combine.py)
    info: dict = field(default_factory=dict)


@dataclass
class Completion:
    """One sampled continuation of a prompt, as the generator returned it."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # behaviour log-probabilities of token_ids under the sampling policy
    stop_reason: str  # "eos" | "length"; multi-turn episodes also "max_turns" | "failed" (see envs/driver.py)
    policy_version: int  # version of the weights that sampled it (the oldest turn's, for a multi-turn episode)
    text: str = ""
    # Per token of token_ids: True where the model produced the token, False where the environment inserted it.
    # None means every token is the model's (a single-turn completion).
    loss_mask: list[bool] | None = None
    messages: list[dict] | None = None  # multi-turn: the whole conversation with roles, for logs
    info: dict[str, float] = field(default_factory=dict)  # multi-turn: turns, tool_calls, tool_errors, ...

    def __post_init__(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != len(self.token_ids):
            raise ValueError(
                f"Completion.loss_mask has {len(self.loss_mask)} entries for {len(self.token_ids)} tokens"
            )

    @property
    def truncated(self) -> bool:
        """Stopped by a budget (tokens, or turns for an episode) rather than finishing."""
        return self.stop_reason in ("length", "max_turns")


@dataclass
class Group:
    """All completions of one prompt, scored. Advantages are relative within the group."""

    problem: Problem
    completions: list[Completion]
    rewards: list[float] = field(default_factory=list)
    components: list[dict[str, float]] = field(default_factory=list)  # per completion: each reward function's score
    correct: list[bool] = field(default_factory=list)  # per completion: the first reward function scored it 1
    reward_failures: int = 0  # completions whose reward function raised or returned NaN

    @property
    def policy_version(self) -> int:
        return min(c.policy_version for c in self.completions)


@dataclass
class Episode:
    """One completion ready for training: its advantage and, when a reference model is used, its logprobs."""

    completion: Completion
    reward: float
    advantage: float
    ref_logprobs: list[float] | None = None

    @property
    def policy_version(self) -> int:
        return self.completion.policy_version


@dataclass
class TrainBatch:
    """Episodes collated into tensors. Prompts are left-padded and responses right-padded, so every
    response starts at column P of the concatenation [prompt_ids | response_ids]."""

    prompt_ids: torch.Tensor  # [B, P] long, left-padded
    prompt_mask: torch.Tensor  # [B, P] bool
    response_ids: torch.Tensor  # [B, R] long, right-padded
    response_mask: torch.Tensor  # [B, R] bool, True on real response tokens (what attention sees)
    behavior_logprobs: torch.Tensor  # [B, R] float, from the generator
    advantages: torch.Tensor  # [B] float
    truncated: torch.Tensor  # [B] bool, stopped at max tokens rather than EOS
    policy_versions: torch.Tensor  # [B] long
    ref_logprobs: torch.Tensor | None = None  # [B, R] float, when a reference model is used
    # [B, R] bool, True on the tokens the loss trains on: the model's own tokens (a subset of response_mask; equal
    # to it for single-turn completions). None is read as response_mask.
    loss_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def rows(self, index: slice | torch.Tensor) -> "TrainBatch":
        """The batch of rows `index` (a slice, or a [n] long tensor of row numbers)."""
        return TrainBatch(**{k: (None if v is None else v[index]) for k, v in self.__dict__.items()})
