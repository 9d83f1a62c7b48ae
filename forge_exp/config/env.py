"""Schemas of the `env` group (conf/env/*.yaml): what an episode is. `single_turn` is one prompt and one completion
scored by the `reward` group (the default): the one-step episode; every other option is a multi-turn environment
built through `_target_` (forge_exp/envs/), run by the episode driver on environment workers, which score the
episodes themselves. docs/agentic.md.

The chosen option's schema is where a run's episode kind is decided: EnvBase lists what the rest of the run asks of
it (which service scores, the token budgets, the evaluation's no-tool control, the warm start's demonstrations), and
apps/rollout.py maps it to the sampling protocol once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from forge_exp.checks import FieldError, at_least, finite, within
from forge_exp.choices import ChatFormat
from forge_exp.config.dataset import PromptedDataset


@dataclass
class EnvBase:
    """What every env option answers, whatever its fields (no fields here: each option orders its own keys)."""

    multi_turn: ClassVar[bool]
    scorer: ClassVar[str]  # the service that scores episodes: reward workers, or the environment workers themselves
    response_budget_key: ClassVar[str]  # the config key that sets response_budget, for the errors that name it

    def response_budget(self, dataset) -> int:
        """The most tokens a sample may hold after its prompt: one completion's, or a whole episode's."""
        raise NotImplementedError

    def sequence_budget(self, dataset) -> int:
        """The longest sequence a generate call may hold: the prompt and what may follow it."""
        raise NotImplementedError

    def sequence_budget_keys(self, dataset) -> str:
        """The keys that set sequence_budget, with their values, for the error that says it does not fit."""
        raise NotImplementedError

    @property
    def tool_control(self) -> bool:
        """The environment's tools can be switched off: an evaluation also measures the accuracy without them."""
        return False

    @property
    def warm_start_episodes(self) -> int:
        """Scripted episodes the supervised warm start trains on instead of bare answers (0: bare answers)."""
        return 0


@dataclass
class SingleTurnEnv(EnvBase):
    """The one-step episode: the prompt, one completion of at most dataset.max_new_tokens, the reward workers'
    score."""

    name: str = "single_turn"
    multi_turn: ClassVar[bool] = False
    scorer: ClassVar[str] = "reward"
    response_budget_key: ClassVar[str] = "dataset.max_new_tokens"

    def response_budget(self, dataset) -> int:
        return dataset.max_new_tokens

    def sequence_budget(self, dataset) -> int:
        return dataset.prompt_budget + dataset.max_new_tokens

    def sequence_budget_keys(self, dataset) -> str:
        what = "dataset.max_prompt_tokens" if isinstance(dataset, PromptedDataset) else "the task's longest prompt"
        return f"a prompt ({what}: {dataset.prompt_budget} tokens) plus dataset.max_new_tokens={dataset.max_new_tokens}"


@dataclass
class MultiTurnEnv(EnvBase):
    """What every multi-turn environment takes: the chat format the episode loop writes turns and tool calls in,
    the episode's bounds, and the failure reward."""

    _target_: str = "forge_exp.envs.calculator.CalculatorEnv"
    name: str = "env"
    multi_turn: ClassVar[bool] = True
    scorer: ClassVar[str] = "env"
    response_budget_key: ClassVar[str] = "env.max_total_tokens"
    chat_format: ChatFormat = ChatFormat.qwen3  # tiny | qwen3 | llama3 (envs/formats.py)
    max_turns: int = 4  # assistant turns; an episode still going after them ends truncated
    max_total_tokens: int = 1024  # prompt + every turn + every insertion
    tool_timeout_s: float = 10.0  # per tool call: a hanging or crashing call is a failed turn
    turn_tokens: int = 256  # new tokens per assistant turn (the episode budget may cut a turn shorter)
    failure_reward: float = 0.0  # added to an episode that ends without the environment saying done

    def __post_init__(self) -> None:
        within("max_turns", self.max_turns, 1, 1000)
        within("max_total_tokens", self.max_total_tokens, 2, 1_048_576)
        within("tool_timeout_s", self.tool_timeout_s, 0, 3600, low_open=True)
        at_least("turn_tokens", self.turn_tokens, 1)
        finite("failure_reward", self.failure_reward)

    def response_budget(self, dataset) -> int:
        return self.max_total_tokens

    def sequence_budget(self, dataset) -> int:
        return self.max_total_tokens + self.turn_tokens  # a turn may run turn_tokens past the shortest budget left

    def sequence_budget_keys(self, dataset) -> str:
        return (f"an episode's longest sequence, env.max_total_tokens={self.max_total_tokens} plus a turn's "
                f"env.turn_tokens={self.turn_tokens}")


@dataclass
class CalculatorEnvConfig(MultiTurnEnv):
    """conf/env/calculator.yaml: a calculator tool over a bounded expression evaluator (no eval of model text)."""

    name: str = "calculator"
    tools_enabled: bool = True  # false: every call is answered with an error (the no-tool control)
    system_prompt: Optional[str] = None  # null: none (the tiny model has no room for one)
    malformed_penalty: float = 0.0  # subtracted per malformed call
    tool_error_penalty: float = 0.0  # subtracted per failed call
    # The supervised warm start of a randomly initialised model (model.warmstart) on scripted episodes played
    # through this environment (data/tool_arithmetic.py) instead of bare answers: how many training problems, and
    # the share of them answered without the tool. 0 = the plain warm start.
    demonstrations: int = 0
    direct_fraction: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("malformed_penalty", self.malformed_penalty, 0)
        at_least("tool_error_penalty", self.tool_error_penalty, 0)
        at_least("demonstrations", self.demonstrations, 0)
        within("direct_fraction", self.direct_fraction, 0, 1)
        if self.demonstrations and self.chat_format != ChatFormat.tiny:
            raise FieldError("demonstrations", "must be 0 unless env.chat_format=tiny (the scripted demonstrations "
                                               "are written in the tiny model's tool format)")

    @property
    def tool_control(self) -> bool:
        return self.tools_enabled

    @property
    def warm_start_episodes(self) -> int:
        return self.demonstrations


@dataclass
class OpenEnvConfig(MultiTurnEnv):
    """conf/env/openenv.yaml: an OpenEnv environment server's tools (envs/openenv.py), one session per episode."""

    _target_: str = "forge_exp.envs.openenv.OpenEnvToolEnv"
    name: str = "openenv"
    base_url: str = "http://127.0.0.1:8000"
    correct_threshold: float = 1.0  # an episode counts as correct at this reward
    connect_timeout_s: float = 10.0
    message_timeout_s: float = 30.0


@dataclass
class VerifiersEnvConfig(MultiTurnEnv):
    """conf/env/verifiers.yaml: a `verifiers` task set (envs/verifiers.py); `taskset` names its builder, e.g.
    {_target_: my_pkg.tasks.make_taskset}."""

    _target_: str = "forge_exp.envs.verifiers.VerifiersTaskEnv"
    name: str = "verifiers"
    taskset: Any = None
    correct_threshold: float = 1.0


ENV_SCHEMAS = {"single_turn": SingleTurnEnv, "calculator": CalculatorEnvConfig, "openenv": OpenEnvConfig,
               "verifiers": VerifiersEnvConfig}
