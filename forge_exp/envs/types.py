"""The environment protocol: what a multi-turn, tool-using episode is made of. Pure (no monarch/mlflow/hydra).

    env.reset(problem)            -> the opening messages (system / user), as chat-template dicts
    env.step(assistant_message)   -> StepResult: new messages (tool results, a user turn) or done, reward parts
    env.tools                     -> the ToolSpecs the chat format advertises to the model

An environment never sees tokens: the episode driver (envs/driver.py) owns tokenisation, the chat format and
sampling, so one environment serves the tiny character model and a Qwen3 alike. `reset` and `step` may be plain or
`async` methods; `close()` (either kind) is optional.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from forge_exp.models.sampling import Sampling  # noqa: F401 — how the generator samples one turn
from forge_exp.rl.types import Problem

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}, HF chat style


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: a name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def schema(self) -> dict[str, Any]:
        """The OpenAI / HF chat-template form (`tools=[...]` of apply_chat_template)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class AssistantMessage:
    """One model turn, parsed by the chat format: the text outside tool calls, the calls, and whether the model
    tried to call a tool but wrote something the format cannot read (`malformed` says what)."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    malformed: str | None = None
    raw: str = ""  # the decoded turn as generated, special tokens included

    def to_dict(self) -> Message:
        out: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return out


@dataclass
class StepResult:
    """What the environment answers to one assistant turn.

    `reward` holds the reward parts given at this step (e.g. {"answer": 1.0} on the last one, {"format": -0.1} on a
    malformed call); the episode's reward is the sum of every part over its steps, and each part is logged.
    """

    messages: list[Message] = field(default_factory=list)  # inserted before the model's next turn
    done: bool = False
    reward: dict[str, float] = field(default_factory=dict)
    correct: bool | None = None  # set on the final step when the task has a notion of a correct answer
    tool_errors: int = 0  # tool calls of this turn that returned an error (bad arguments, unknown tool, ...)


@runtime_checkable
class Environment(Protocol):
    tools: Sequence[ToolSpec]

    def reset(self, problem: Problem) -> list[Message] | Awaitable[list[Message]]: ...

    def step(self, message: AssistantMessage) -> StepResult | Awaitable[StepResult]: ...


@dataclass(frozen=True)
class EpisodeLimits:
    """Bounds of one episode. Keys are named as the `env` config group will name them."""

    max_turns: int = 4  # assistant turns; an episode still going after them ends truncated
    max_total_tokens: int = 1024  # prompt + every turn + every insertion
    tool_timeout_s: float = 10.0  # per tool call: a step may take this long for each call it makes
    # (ranges: the env schema's, config/env.py)


def tool_message(call: ToolCall, content: Any) -> Message:
    """A tool result as a chat message (content JSON-encoded unless it is already text)."""
    text = content if isinstance(content, str) else json.dumps(content)
    return {"role": "tool", "name": call.name, "tool_call_id": call.id, "content": text}
