"""The episode loop: problems -> groups of multi-turn episodes, one environment per sample. Pure and async.

    groups = await run_episodes(make_env, problems, group_size, generate, tokenizer, chat_format, sampling, limits)

    per problem, group_size episodes, each with its own environment and its own conversation:
        reset -> prompt tokens
        while any episode is running:
            one generate() call for every running episode (a batch; the first turn samples n = group_size per prompt)
            parse each turn -> env.step (concurrently, each under its timeout) -> inserted tokens, or done

`generate(prompts, sampling) -> list[list[Generation]]` is the generator service's call: one list of `sampling.n`
Generations (token_ids, logprobs, stop_reason) per prompt. A Generation may carry a `policy_version` attribute; the
episode keeps the oldest version any of its turns was sampled with.

An episode ends when the environment says done ("eos"), when a turn is cut by the token budget ("length"), after
`max_turns` turns ("max_turns"), or when a step raises or runs past its timeout ("failed": counted, failure reward).
A failed step never stops the run. Every episode becomes one Completion: `token_ids` = every token after the prompt,
`loss_mask` True on the model's tokens, `logprobs` 0.0 on the environment's (they are masked out of the loss).
Episodes that end without the environment saying done (truncated, failed) get `failure_reward` added to the reward
parts they earned on the way. Groups keep the episodes whose environment reset (a failed reset is counted in
`info["reset_failures"]`; a group with none left is dropped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Sequence
import threading
from dataclasses import dataclass, field
from typing import Any

from forge_exp.envs.formats import ChatFormat
from forge_exp.envs.types import AssistantMessage, Environment, EpisodeLimits, Message, Sampling
from forge_exp.rl.types import Completion, Group, Problem

GenerateFn = Callable[[list[list[int]], Sampling], Awaitable[list[list[Any]]]]


@dataclass
class _Episode:
    env: Environment
    problem: Problem
    prompt_ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    correct: bool = False
    version: int | None = None
    stop: str | None = None  # set when the episode has ended
    counts: dict[str, float] = field(
        default_factory=lambda: dict(turns=0, tool_calls=0, tool_errors=0, malformed_calls=0, failed_turns=0)
    )

    def add(self, ids: list[int], logprobs: list[float] | None, model: bool) -> None:
        self.tokens += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [model] * len(ids)

    def length(self) -> int:
        return len(self.prompt_ids) + len(self.tokens)


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


async def _call(fn, *args, timeout: float):
    """Run an environment method under a timeout; a sync one in a thread of its own, so a slow one cannot stall the
    loop. Python cannot kill a thread: one that hangs is a daemon thread left behind (it cannot hold up the
    process's exit, nor starve a shared pool), the episode fails and the run moves on."""
    if inspect.iscoroutinefunction(fn):
        return await asyncio.wait_for(fn(*args), timeout)
    result = await asyncio.wait_for(_in_thread(fn, *args), timeout)
    return await asyncio.wait_for(_maybe_await(result), timeout)


def _in_thread(fn, *args) -> asyncio.Future:
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value, error) -> None:
        if not future.done():  # cancelled by the timeout: nobody waits any more
            future.set_exception(error) if error is not None else future.set_result(value)

    def target() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting episode
            value, error = None, e
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop closed while this thread hung
            pass

    threading.Thread(target=target, name="forge-env-step", daemon=True).start()
    return future


async def run_episodes(
    make_env: Callable[[], Environment],
    problems: Sequence[Problem],
    group_size: int,
    generate: GenerateFn,
    tokenizer: Any,
    chat_format: ChatFormat,
    sampling: Sampling,
    limits: EpisodeLimits,
    *,
    failure_reward: float = 0.0,
    policy_version: int = 0,
) -> list[Group]:
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    groups = [[_Episode(make_env(), p) for _ in range(group_size)] for p in problems]
    episodes = [e for g in groups for e in g]
    try:
        await asyncio.gather(*(_reset(e, tokenizer, chat_format, limits) for e in episodes))
        stop_ids = chat_format.stop_ids(tokenizer)
        first = True
        while running := [e for e in episodes if e.stop is None]:
            await _generate_turn(running, groups if first else None, generate, sampling, limits, stop_ids, tokenizer)
            first = False
            await asyncio.gather(
                *(_step(e, tokenizer, chat_format, limits) for e in running if e.stop is None)
            )
    finally:
        await asyncio.gather(*(_close(e.env) for e in episodes), return_exceptions=True)
    return [_to_group(g, tokenizer, failure_reward, policy_version) for g in groups if _kept(g)]


async def _reset(e: _Episode, tokenizer, chat_format: ChatFormat, limits: EpisodeLimits) -> None:
    try:
        opening = await _call(e.env.reset, e.problem, timeout=limits.tool_timeout_s)
    except Exception as err:  # noqa: BLE001 - a broken environment is a failed episode, not a dead run
        e.stop, e.messages = "reset_failed", [{"role": "error", "content": f"reset failed: {err!r}"}]
        return
    e.messages = list(opening)
    e.prompt_ids = chat_format.prompt_ids(tokenizer, e.messages, e.env.tools)
    if len(e.prompt_ids) >= limits.max_total_tokens:
        e.stop = "length"


async def _generate_turn(running, groups, generate: GenerateFn, sampling: Sampling, limits, stop_ids, tokenizer) -> None:
    budget = {id(e): limits.max_total_tokens - e.length() for e in running}
    call = dataclasses.replace(sampling, max_new_tokens=min(sampling.max_new_tokens, max(budget.values())))
    if groups is not None and _same_prompts(groups, running):  # first turn: n samples of each prompt in one call
        live = [g for g in groups if g[0].stop is None]
        outs = await generate([g[0].prompt_ids for g in live], dataclasses.replace(call, n=len(live[0])))
        pairs = [(e, o) for g, row in zip(live, outs) for e, o in zip(g, row)]
    else:  # every episode has its own context
        outs = await generate([e.prompt_ids + e.tokens for e in running], dataclasses.replace(call, n=1))
        pairs = [(e, row[0]) for e, row in zip(running, outs)]
    for e, gen in pairs:
        ids, logprobs, reason = list(gen.token_ids), list(gen.logprobs), gen.stop_reason
        if len(ids) > budget[id(e)]:  # the call's budget is the largest; this episode has less left
            ids, logprobs, reason = ids[: budget[id(e)]], logprobs[: budget[id(e)]], "length"
        if reason == "eos" and (not ids or ids[-1] not in stop_ids):
            reason = "length"
        e.add(ids, logprobs, model=True)
        version = getattr(gen, "policy_version", None)
        if version is not None:
            e.version = version if e.version is None else min(e.version, version)
        e.counts["turns"] += 1
        if reason != "eos":  # the turn never finished: the episode is truncated, the environment not asked
            e.messages.append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=False)})
            e.stop = "length"


async def _step(e: _Episode, tokenizer, chat_format: ChatFormat, limits: EpisodeLimits) -> None:
    turn_ids = _last_turn(e)
    msg: AssistantMessage = chat_format.parse(tokenizer, turn_ids)
    e.messages.append(msg.to_dict() if msg.malformed is None else {"role": "assistant", "content": msg.raw})
    e.counts["tool_calls"] += len(msg.tool_calls)
    e.counts["malformed_calls"] += msg.malformed is not None
    try:
        result = await _call(e.env.step, msg, timeout=limits.tool_timeout_s * max(1, len(msg.tool_calls)))
    except Exception as err:  # noqa: BLE001 - crash or timeout (TimeoutError): a failed turn
        e.counts["failed_turns"] += 1
        e.counts["tool_errors"] += len(msg.tool_calls)
        e.messages.append({"role": "error", "content": f"step failed: {err!r}"})
        e.stop = "failed"
        return
    for k, v in result.reward.items():
        e.parts[k] = e.parts.get(k, 0.0) + float(v)
    e.counts["tool_errors"] += result.tool_errors
    if result.done:
        e.stop, e.correct = "eos", bool(result.correct)
        return
    if e.counts["turns"] >= limits.max_turns:
        e.stop = "max_turns"
        return
    inserted = chat_format.env_ids(tokenizer, result.messages)
    e.messages += result.messages
    if e.length() + len(inserted) >= limits.max_total_tokens:  # no room left for the model to answer
        e.stop = "length"
        return
    e.add(inserted, None, model=False)


def _same_prompts(groups: list[list[_Episode]], running: list[_Episode]) -> bool:
    """Every running episode belongs to a fully running group whose samples share one prompt."""
    live = [g for g in groups if g[0].stop is None]
    return (
        sum(len(g) for g in live) == len(running)
        and all(e.stop is None and e.prompt_ids == g[0].prompt_ids for g in live for e in g)
        and len({len(g) for g in live}) == 1
    )


def _last_turn(e: _Episode) -> list[int]:
    """The ids of the model turn just generated: the trailing run of model tokens."""
    start = len(e.mask)
    while start > 0 and e.mask[start - 1]:
        start -= 1
    return e.tokens[start:]


async def _close(env) -> None:
    close = getattr(env, "close", None)
    if close is not None:
        await _maybe_await(close())


def _kept(group: list[_Episode]) -> bool:
    return any(e.stop != "reset_failed" for e in group)


def _to_group(group: list[_Episode], tokenizer, failure_reward: float, policy_version: int) -> Group:
    """One Group of the episodes whose environment reset; those whose reset failed are dropped (counted)."""
    kept = [e for e in group if e.stop != "reset_failed"]
    completions, rewards, components, correct = [], [], [], []
    for e in kept:
        finished = e.stop == "eos"
        completions.append(
            Completion(
                prompt_ids=e.prompt_ids,
                token_ids=e.tokens,
                logprobs=e.logprobs,
                stop_reason=e.stop,
                policy_version=policy_version if e.version is None else e.version,
                text=tokenizer.decode(e.tokens, skip_special_tokens=False),
                loss_mask=e.mask,
                messages=e.messages,
                info={**e.counts, "reset_failures": float(len(group) - len(kept))},
            )
        )
        # An unfinished episode keeps the parts it earned on the way (penalties) and gets failure_reward on top.
        rewards.append(sum(e.parts.values()) + (0.0 if finished else failure_reward))
        components.append(dict(e.parts))
        correct.append(finished and e.correct)
    failures = sum(e.stop == "failed" for e in kept)
    return Group(group[0].problem, completions, rewards, components, correct, reward_failures=failures)
