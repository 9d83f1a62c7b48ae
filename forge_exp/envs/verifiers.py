"""Prime Intellect verifiers tasks (PyPI `verifiers`, v1 API; extra `forge-exp[verifiers]`) as forge_exp Environments.

A verifiers taskset yields Tasks: a prompt (and system prompt), tool servers (`Toolset`s with `@vf.tool` methods)
and scoring (`@vf.reward` / `@vf.metric` methods, plugged judges) over the finished conversation, a `vf.Trace`.
verifiers' own rollout loop runs an agent harness against an OpenAI-style endpoint; here forge_exp's driver owns
tokenisation and sampling instead, and this adapter plays the task's part:

    problems = verifiers_problems(taskset)                 # Problem(prompt, target=task.key) per task
    make_env = lambda: VerifiersTaskEnv(taskset)
    reset(problem)   the task's system prompt + prompt; its toolsets' (and the taskset's) @vf.tool methods as tools
    step(message)    tool calls -> the tool methods, called in this process (an exception is an error reply);
                     a turn without calls is the final answer: the conversation becomes a vf.Trace, the task's
                     own `score()` runs, and each of `trace.rewards` becomes a reward part (weighted value)

Departures from a verifiers rollout: tools run in this process (no per-rollout MCP server or sandbox runtime, so
tasks that need a container — `NEEDS_CONTAINER` — are refused), `@vf.stop` hooks and task `setup`/`finalize`
are not run, and scoring runs without a runtime (signals that require one are skipped, as verifiers does offline).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable
from typing import Any

from forge_exp.envs.types import AssistantMessage, Message, StepResult, ToolCall, ToolSpec, tool_message
from forge_exp.rl.types import Problem

try:
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.utils.decorators import discover_decorated
except ImportError as e:  # the extra is optional
    raise ImportError("the verifiers adapter needs `pip install forge-exp[verifiers]` (verifiers)") from e


def verifiers_problems(tasks: Iterable[vf.Task]) -> list[Problem]:
    """One Problem per task; `target` carries the task's key, which VerifiersTaskEnv looks the task up by."""
    return [Problem(prompt=t.data.prompt_text, target=t.key, question=t.data.name or t.data.prompt_text) for t in tasks]


def _schema(fn) -> dict[str, Any]:
    """JSON schema of a tool method's parameters (pydantic reads the annotations)."""
    from pydantic import create_model

    fields = {
        name: (p.annotation if p.annotation is not inspect.Parameter.empty else Any,
               ... if p.default is inspect.Parameter.empty else p.default)
        for name, p in inspect.signature(fn).parameters.items()
    }
    schema = create_model(f"{fn.__name__}_args", **fields).model_json_schema()
    schema.pop("title", None)
    return schema


class VerifiersTaskEnv:
    def __init__(self, taskset: vf.Taskset | Iterable[vf.Task], *, correct_threshold: float = 1.0) -> None:
        self._shared = type(taskset).toolsets(taskset.config) if isinstance(taskset, vf.Taskset) else []
        self.tasks = {t.key: t for t in taskset}
        self.correct_threshold = correct_threshold
        self.tools: tuple[ToolSpec, ...] = ()
        self._fns: dict[str, Any] = {}
        self._nodes: list[MessageNode] = []

    def reset(self, problem: Problem) -> list[Message]:
        task = self.tasks.get(problem.target)
        if task is None:
            raise KeyError(f"no verifiers task with key {problem.target!r}: build the problems with verifiers_problems")
        if task.NEEDS_CONTAINER:
            raise ValueError(f"verifiers task {type(task).__name__} needs a container; it cannot run in process")
        self.task = task
        self._fns = {}
        for toolset in [*type(task).toolsets(task.config), *self._shared]:
            for fn in discover_decorated(toolset, "tool"):
                self._fns[getattr(fn, "tool_name", None) or fn.__name__] = toolset._with_state(fn)
        self.tools = tuple(
            ToolSpec(name, (inspect.getdoc(fn) or "").strip(), _schema(fn)) for name, fn in self._fns.items()
        )
        opening: list[Message] = []
        if task.data.system_prompt:
            opening.append({"role": "system", "content": task.data.system_prompt})
        prompt = task.data.prompt
        if isinstance(prompt, str):
            opening.append({"role": "user", "content": prompt})
        else:
            opening += [m.model_dump(exclude_none=True) for m in prompt or []]
        self._nodes = []
        for m in opening:
            self._append(vf.SystemMessage(content=m["content"]) if m["role"] == "system" else vf.UserMessage(content=m["content"]))
        return opening

    async def step(self, message: AssistantMessage) -> StepResult:
        calls = [vf.ToolCall(id=c.id or f"call_{i}", name=c.name, arguments=json.dumps(c.arguments))
                 for i, c in enumerate(message.tool_calls)]
        self._append(vf.AssistantMessage(content=message.content, tool_calls=calls or None), sampled=True)
        if message.malformed is not None:
            return self._reply([({"role": "tool", "content": f"error: {message.malformed}"}, "malformed")])
        if not message.tool_calls:
            return await self._score()
        replies = []
        for call in message.tool_calls:
            text, ok = await self._call(call)
            replies.append((tool_message(call, text), ok))
        return self._reply(replies)

    async def _call(self, call: ToolCall) -> tuple[str, bool]:
        fn = self._fns.get(call.name)
        if fn is None:
            return f"error: unknown tool {call.name!r}; tools: {', '.join(self._fns)}", False
        try:
            result = await fn(**call.arguments)
        except Exception as e:  # noqa: BLE001 - a tool's failure is the model's information, not a crash
            return f"error: {type(e).__name__}: {e}", False
        return result if isinstance(result, str) else json.dumps(result, default=str), True

    def _reply(self, replies: list[tuple[Message, bool | str]]) -> StepResult:
        for m, _ in replies:
            self._append(vf.ToolMessage(tool_call_id=m.get("tool_call_id") or "none", content=m["content"], name=m.get("name")))
        errors = sum(ok is False for _, ok in replies)
        return StepResult(messages=[m for m, _ in replies], tool_errors=errors)

    async def _score(self) -> StepResult:
        t = self.task
        trace = vf.Trace(
            task=vf.TraceTask(type=type(t).__name__, data=t.data, key=t.key, hash=t.hash),
            agent=vf.AgentInfo(config=vf.AgentConfig()),
            nodes=self._nodes,
        )
        await t.score(trace)
        parts = {name: r.value for name, r in trace.rewards.items() if r is not None}
        total = sum(parts.values())
        return StepResult(done=True, reward=parts, correct=total >= self.correct_threshold)

    def _append(self, message, sampled: bool = False) -> None:
        parent = len(self._nodes) - 1 if self._nodes else None
        self._nodes.append(MessageNode(parent=parent, message=message, sampled=sampled))
