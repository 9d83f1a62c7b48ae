"""OpenEnv environments (PyPI `openenv-core`, extra `forge-exp[openenv]`) as forge_exp Environments.

An OpenEnv environment runs as its own server (FastAPI + WebSocket, one session per client). This adapter is one
client session per episode, speaking OpenEnv's tool protocol (RFC 003: `list_tools` / `call_tool` actions of an
MCPEnvironment):

    reset(problem)   connect, reset the server's episode (`reset_kwargs(problem)` -> keyword arguments of the
                     server's reset), list its tools (advertised to the model), open with `opening(problem)`
    step(message)    every tool call -> one call_tool action; the tool's text (or its error) becomes a tool
                     message; the observation's reward is a reward part ("env"), its `done` ends the episode
                     a final answer (a turn without calls) -> `answer_action(text)` when given (e.g. a submit
                     tool's call), scored by the server; without it the episode ends with the rewards so far

    make_env = lambda: OpenEnvToolEnv("http://127.0.0.1:8000", reset_kwargs=lambda p: {"seed": 0},
                                      answer_action=lambda text: call_tool("submit", answer=text))

Timeouts: the driver bounds each step (env.tool_timeout_s per call); `message_timeout_s` bounds each WebSocket
reply, so a server that stops answering fails the turn instead of hanging the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forge_exp.envs.types import AssistantMessage, Message, StepResult, ToolCall, ToolSpec, tool_message
from forge_exp.rl.types import Problem


def call_tool(name: str, **arguments: Any) -> dict[str, Any]:
    """The wire form of OpenEnv's CallToolAction."""
    return {"type": "call_tool", "tool_name": name, "arguments": arguments}


def _default_opening(problem: Problem) -> list[Message]:
    return [{"role": "user", "content": problem.prompt}]


def tool_text(observation: dict[str, Any]) -> tuple[str, bool]:
    """(text, ok) of a CallToolObservation payload: the MCP result's text parts, or the error message."""
    error = observation.get("error")
    if error:
        return f"error: {error.get('message', error) if isinstance(error, dict) else error}", False
    result = observation.get("result")
    if isinstance(result, dict):
        texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict)]
        if result.get("is_error"):
            return "error: " + " ".join(texts), False
        if texts:
            return "\n".join(texts), True
        return str(result.get("data", "")), True
    return "" if result is None else str(result), True


class OpenEnvToolEnv:
    """One OpenEnv session per episode. `hide_tools` keeps tools (e.g. a submit tool driven by `answer_action`)
    out of what the model is shown."""

    def __init__(
        self,
        base_url: str,
        *,
        reset_kwargs: Callable[[Problem], dict[str, Any]] = lambda problem: {},
        opening: Callable[[Problem], list[Message]] = _default_opening,
        answer_action: Callable[[str], dict[str, Any]] | None = None,
        hide_tools: tuple[str, ...] = (),
        correct_threshold: float = 1.0,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 30.0,
    ) -> None:
        try:
            from openenv.core.generic_client import GenericEnvClient
        except ImportError as e:  # the extra is optional
            raise ImportError("the OpenEnv adapter needs `pip install forge-exp[openenv]` (openenv-core)") from e
        self._client = GenericEnvClient(
            base_url=base_url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s
        )
        self.reset_kwargs, self.opening, self.answer_action = reset_kwargs, opening, answer_action
        self.hide_tools, self.correct_threshold = set(hide_tools), correct_threshold
        self.tools: tuple[ToolSpec, ...] = ()

    async def reset(self, problem: Problem) -> list[Message]:
        await self._client.connect()
        await self._client.reset(**self.reset_kwargs(problem))
        listed = await self._client.step({"type": "list_tools"})
        self.tools = tuple(
            ToolSpec(t["name"], t.get("description", ""), t.get("input_schema") or t.get("inputSchema") or {})
            for t in listed.observation.get("tools", [])
            if t["name"] not in self.hide_tools
        )
        return self.opening(problem)

    async def step(self, message: AssistantMessage) -> StepResult:
        if message.malformed is not None:
            return StepResult(messages=[{"role": "tool", "content": f"error: {message.malformed}"}])
        if not message.tool_calls:
            if self.answer_action is None:
                return StepResult(done=True)
            result = await self._client.step(self.answer_action(message.content))
            reward = float(result.reward or 0.0)
            return StepResult(done=True, reward={"env": reward}, correct=reward >= self.correct_threshold)
        replies, errors, reward, done = [], 0, 0.0, False
        for call in message.tool_calls:
            text, ok = await self._call(call)
            replies.append(tool_message(call, text))
            errors += not ok
            reward += float(self._last.reward or 0.0)
            done = done or bool(self._last.done)
        parts = {"env": reward} if reward else {}
        correct = reward >= self.correct_threshold if done else None
        return StepResult(messages=replies, done=done, reward=parts, correct=correct, tool_errors=errors)

    async def _call(self, call: ToolCall) -> tuple[str, bool]:
        known = {t.name for t in self.tools}
        if call.name not in known:
            self._last = _NoResult
            return f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(known))}", False
        self._last = await self._client.step(call_tool(call.name, **call.arguments))
        return tool_text(self._last.observation)

    async def close(self) -> None:
        await self._client.close()


class _NoResult:
    reward, done = None, False
