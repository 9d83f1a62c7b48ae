"""Schemas of the `algorithm` group (conf/algorithm/*.yaml): the GRPO family (RLAlgorithm) and SFT, and of their
`loss` node, one schema per loss family.

Each knob has one home: a loss's knobs live in `algorithm.loss` (swept as `algorithm.loss.clip_high=...`, or with
the short alias `algorithm.clip_high=...` that the CLI expands to the same key: config/aliases.py), and their
schema, defaults and ranges are the losses' own (rl/loss_options.py); batch, optimizer, sampling and filters live in
`algorithm` itself, checked here.
docs/algorithms.md describes every algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from omegaconf import DictConfig, OmegaConf

from forge_exp.checks import FieldError, at_least, finite, positive, within
from forge_exp.choices import Advantage
from forge_exp.rl.loss_options import LOSS_OPTIONS


# ---------------------------------------------------------------------------------------------- losses
def loss_node(schema: type) -> DictConfig:
    """A loss family's schema (rl/loss_options.py) as the `algorithm.loss` node: in a run a null horizon is the
    longest response, the one loss knob other groups decide: a whole episode's env.max_total_tokens when the env is
    multi-turn, else one completion's dataset.max_new_tokens (EnvBase.response_budget; resolved when the config is,
    so the composed config and the MLflow params show the number)."""
    node = OmegaConf.structured(schema)
    if "horizon" in node:
        node.horizon = "${oc.select:env.max_total_tokens,${dataset.max_new_tokens}}"
    return node


# ---------------------------------------------------------------------------------------------- algorithms
@dataclass
class AlgorithmBase:
    """What RL and SFT share: the name, AdamW and the step around it, and the loss; and which loop runs them."""

    app: ClassVar[str]  # the loop in forge_exp/apps/ that trains with this algorithm: grpo | sft
    name: str = "grpo"
    lr: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    grad_accum: int = 1  # micro-batches per step
    loss: Any = None  # typed by the option's defaults: /schema/loss/<family>@loss

    def __post_init__(self) -> None:
        if not self.name:
            raise FieldError("name", "must be a non-empty string")
        positive("lr", self.lr)
        finite("lr", self.lr)
        at_least("weight_decay", self.weight_decay, 0)
        finite("weight_decay", self.weight_decay)
        if self.loss is None:
            raise FieldError("loss", "must be a node with _target_ (the option's default, conf/algorithm/"
                                     f"{self.name}.yaml); leave algorithm.loss out rather than set it to null")
        positive("max_grad_norm", self.max_grad_norm)
        at_least("grad_accum", self.grad_accum, 1)

    @property
    def needs_reference(self) -> bool:
        """The loss has a KL term to a reference policy (beta > 0): every episode carries the reference model's
        logprobs, which a reference model (or, with LoRA, the trainer's base with its adapters off) computes. The
        one place that decides it."""
        return self.beta > 0

    @property
    def loss_inputs(self) -> set[str]:
        """What the trainer's step hands this algorithm's loss, by argument name (what it is told to serve)."""
        raise NotImplementedError

    @property
    def rows_in_flight(self) -> int:
        """Completions that may be in flight at once, what a generator's KV cache is sized for. An algorithm that
        samples no rollouts (SFT) sizes the generator of an evaluation (mode=eval) for this many."""
        return 64

    def check_with(self, dataset, env, generator) -> None:
        """What the algorithm asks of the other groups' choices (ForgeConfig calls it; raises FieldError)."""


@dataclass
class RLAlgorithm(AlgorithmBase):
    """The GRPO family (apps/grpo.py). Defaults are GRPO's (DeepSeekMath, arXiv 2402.03300), batch sized for one
    node."""

    app: ClassVar[str] = "grpo"

    # --- batch: prompts_per_step groups of group_size completions per optimizer step
    group_size: int = 8
    prompts_per_step: int = 16
    # --- advantages (rl/advantages.py)
    advantage: Advantage = Advantage.group_norm  # group_norm | mean | loo
    advantage_eps: float = 1e-6  # group_norm: (r − mean) / (std + eps)
    # --- group filters (rl/filters.py, DAPO)
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal, refill
    max_sampling_attempts: int = 3  # generation rounds per batch before training on what is there
    overlong_filter: bool = False  # truncated completions get no loss
    # soft overlong punishment added to the reward; L_max is the response budget: dataset.max_new_tokens, or a
    # multi-turn env's whole episode (env.max_total_tokens)
    overlong_penalty: bool = False
    overlong_buffer: Optional[int] = None  # L_cache in tokens; null = L_max // 5 (the paper's 4096 of 20480)
    # --- sampling of training rollouts
    temperature: float = 1.0
    top_p: float = 1.0
    # rollouts may be this many weight versions behind the trainer; 0 = on-policy. Up to max_policy_age + 1 batches
    # are generated at once (the generator decodes their rows together: apps/grpo.py)
    max_policy_age: int = 1
    # false: a batch begins as soon as it is within max_policy_age versions, so generation runs beside training;
    # true: batches begin in waves of max_policy_age + 1, each wave once every batch before it has trained, so
    # generation and training take turns (one GPU shared by both: no fight over its SMs) and samples are 0, 1, ...
    # max_policy_age versions old instead of max_policy_age (driver/overlap.py)
    rollout_waves: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("group_size", self.group_size, 2, "advantages are relative within a group")
        at_least("prompts_per_step", self.prompts_per_step, 1)
        at_least("max_sampling_attempts", self.max_sampling_attempts, 1)
        at_least("max_policy_age", self.max_policy_age, 0)
        positive("advantage_eps", self.advantage_eps)
        positive("temperature", self.temperature, "0 is greedy decoding, which gives a group identical completions")
        within("top_p", self.top_p, 0, 1, low_open=True)
        if self.overlong_buffer is not None:
            at_least("overlong_buffer", self.overlong_buffer, 1)

    @property
    def beta(self) -> float:
        """The KL coefficient of the loss (0 for a loss without one); see needs_reference."""
        return float(getattr(self.loss, "beta", 0.0) or 0.0)

    @property
    def loss_inputs(self) -> set[str]:
        from forge_exp.trainers.update import available_inputs  # torch: only where a trainer or its check runs

        return available_inputs(self.needs_reference)

    @property
    def rows_in_flight(self) -> int:
        return self.prompts_per_step * self.group_size * (self.max_policy_age + 1)

    def check_with(self, dataset, env, generator) -> None:
        budget = env.response_budget(dataset)  # L_max: what the loop penalizes against (apps/grpo.py)
        if self.overlong_buffer is not None and self.overlong_buffer > budget:
            raise FieldError("algorithm.overlong_buffer", f"must be <= {env.response_budget_key}={budget} (DAPO's "
                             f"L_cache within L_max), got {self.overlong_buffer}")
        if generator.name == "vllm" and self.top_p < 1:
            raise FieldError("algorithm.top_p", f"must be 1 with generator=vllm (got {self.top_p}): vLLM returns the "
                             f"truncated distribution's logprobs, which the trainer does not recompute")

    def overlong_buffer_len(self, max_len: int) -> int:
        """L_cache of DAPO's soft overlong punishment, in tokens, for responses of at most max_len tokens."""
        return self.overlong_buffer if self.overlong_buffer is not None else max(1, max_len // 5)


@dataclass
class SFTAlgorithm(AlgorithmBase):
    """Supervised fine-tuning (apps/sft.py, data/sft.py)."""

    app: ClassVar[str] = "sft"
    name: str = "sft"
    lr: float = 1e-5
    batch_size: int = 8  # rows per optimizer step
    max_seq_len: int = 2048  # tokens per row; a longer example is cut to it
    packing: bool = True  # several examples per row, each with its own position ids and attention
    warmup_steps: int = 0  # linear lr warm-up, then cosine decay to 10% of lr at the last step

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("batch_size", self.batch_size, 1)
        at_least("max_seq_len", self.max_seq_len, 2, "a target token needs one token before it")
        at_least("warmup_steps", self.warmup_steps, 0)

    beta = 0.0  # no reference model

    @property
    def loss_inputs(self) -> set[str]:
        from forge_exp.trainers.sft import SFT_INPUTS  # torch: only where a trainer or its check runs

        return set(SFT_INPUTS)


LOSS_SCHEMAS = LOSS_OPTIONS  # rl/loss_options.py, registered through loss_node
ALGORITHM_SCHEMAS = {"rl": RLAlgorithm, "sft": SFTAlgorithm}
