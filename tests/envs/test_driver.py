import asyncio
import re
import time

import pytest

from forge_exp.envs import CalculatorEnv, EpisodeLimits, Sampling, StepResult, TinyToolFormat, build_chat_format, run_episodes
from forge_exp.envs.calculator import SYSTEM_PROMPT
from forge_exp.envs.report import conversation_rows, episode_metrics
from forge_exp.models.tokenizer import TOOL_ALPHABET, build_char_tokenizer
from forge_exp.rl.types import Problem
from tests.envs.helpers import Scripted, template_tokenizer

TOK, FMT = build_char_tokenizer(TOOL_ALPHABET), TinyToolFormat()
P1, P2 = Problem("12*34=", "408", "12*34"), Problem("99*99=", "9801", "99*99")
SAMPLING, LIMITS = Sampling(temperature=1.0, max_new_tokens=16), EpisodeLimits(max_turns=3, max_total_tokens=64, tool_timeout_s=2.0)


def agent(context: str) -> str:
    """Calls the tool on the question, then copies the tool's result."""
    if context.endswith(")"):
        return re.findall(r"\((\d+)\)", context)[-1]
    return "[" + context.removeprefix("<bos>").rstrip("=") + "]"


def run(make_env, problems, generate, group_size=2, limits=LIMITS, tok=TOK, fmt=FMT, sampling=SAMPLING, **kw):
    return asyncio.run(run_episodes(make_env, problems, group_size, generate, tok, fmt, sampling, limits, **kw))


def test_episode_tokens_masks_and_reward():
    gen = Scripted(TOK, agent)
    groups = run(lambda: CalculatorEnv(system_prompt=None), [P1, P2], gen)
    c = groups[0].completions[0]
    assert TOK.decode(c.prompt_ids) == "<bos>12*34="
    assert TOK.decode(c.token_ids) == "[12*34]<eos>(408)408<eos>"
    # model tokens: "[12*34]<eos>" (8) and "408<eos>" (4); environment tokens: "(408)" (5)
    assert c.loss_mask == [True] * 8 + [False] * 5 + [True] * 4
    assert c.logprobs == [-0.5] * 8 + [0.0] * 5 + [-0.5] * 4
    assert c.stop_reason == "eos" and not c.truncated
    assert groups[0].rewards == [1.0, 1.0] and groups[0].correct == [True, True]
    assert groups[0].components[0] == {"answer": 1.0}
    assert c.info["turns"] == 2 and c.info["tool_calls"] == 1 and c.info["tool_errors"] == 0
    assert [m["role"] for m in c.messages] == ["user", "assistant", "tool", "assistant"]
    # first turn: one call with n = group_size per problem; second: one row per episode, each its own context
    (prompts1, s1), (prompts2, s2) = gen.calls
    assert s1.n == 2 and len(prompts1) == 2 and s2.n == 1 and len(prompts2) == 4


def test_samples_follow_their_own_conversations():
    answers = iter(["[1+1]", "[2+2]", "[3+3]", "[4+4]"])

    def reply(context):
        return next(answers) if context.endswith("=") else re.findall(r"\((\d+)\)", context)[-1]

    groups = run(lambda: CalculatorEnv(system_prompt=None), [P1], Scripted(TOK, reply), group_size=4)
    texts = [TOK.decode(c.token_ids) for c in groups[0].completions]
    assert texts == ["[1+1]<eos>(2)2<eos>", "[2+2]<eos>(4)4<eos>", "[3+3]<eos>(6)6<eos>", "[4+4]<eos>(8)8<eos>"]
    assert groups[0].rewards == [0.0] * 4


class Crashing(CalculatorEnv):
    def step(self, message):
        if message.tool_calls and message.tool_calls[0].arguments["expression"] == "99*99":
            raise RuntimeError("tool crashed")
        return super().step(message)


class Hanging(CalculatorEnv):
    def step(self, message):
        if message.tool_calls:
            time.sleep(3.0)  # past the 0.5 s timeout below
        return super().step(message)


class AsyncHanging(CalculatorEnv):
    async def step(self, message):
        await asyncio.sleep(30)


@pytest.mark.parametrize("env_cls", [Crashing, Hanging, AsyncHanging])
def test_crashing_or_hanging_tool_is_a_failed_turn_not_a_dead_run(env_cls):
    limits = EpisodeLimits(max_turns=3, max_total_tokens=64, tool_timeout_s=0.5)
    t0 = time.perf_counter()
    groups = run(lambda: env_cls(system_prompt=None), [P1, P2], Scripted(TOK, agent), limits=limits,
                 failure_reward=-1.0)
    assert time.perf_counter() - t0 < 10
    failed = groups[1]  # 99*99 fails for every env class
    assert [c.stop_reason for c in failed.completions] == ["failed", "failed"]
    assert failed.rewards == [-1.0, -1.0] and failed.reward_failures == 2
    assert failed.completions[0].info["failed_turns"] == 1 and failed.completions[0].info["tool_errors"] == 1
    assert failed.completions[0].messages[-1]["role"] == "error"
    if env_cls is Crashing:  # the other problem's episodes are unaffected
        assert groups[0].rewards == [1.0, 1.0]
    assert episode_metrics(groups)["env/failed_turns"] == (2 if env_cls is Crashing else 4)


def test_max_turns_and_token_budget_truncate():
    stubborn = Scripted(TOK, lambda ctx: "[1+1]")  # never answers
    groups = run(lambda: CalculatorEnv(system_prompt=None), [P1], stubborn, limits=EpisodeLimits(max_turns=3, max_total_tokens=64))
    c = groups[0].completions[0]
    assert c.stop_reason == "max_turns" and c.truncated and c.info["turns"] == 3 and groups[0].rewards[0] == 0.0
    groups = run(lambda: CalculatorEnv(system_prompt=None), [P1], stubborn, limits=EpisodeLimits(max_turns=10, max_total_tokens=24))
    c = groups[0].completions[0]
    assert c.stop_reason == "length" and len(c.prompt_ids) + len(c.token_ids) <= 24


def test_turn_cut_by_the_budget_and_malformed_calls():
    groups = run(lambda: CalculatorEnv(system_prompt=None), [P1], Scripted(TOK, lambda ctx: "1" * 40),
                 limits=EpisodeLimits(max_turns=3, max_total_tokens=20))
    c = groups[0].completions[0]
    assert c.stop_reason == "length" and len(c.prompt_ids) + len(c.token_ids) == 20 and all(c.loss_mask)
    replies = iter(["[12*", "[12*34]", "408"])
    groups = run(lambda: CalculatorEnv(system_prompt=None), [P1], Scripted(TOK, lambda ctx: next(replies)), group_size=1)
    c = groups[0].completions[0]
    assert TOK.decode(c.token_ids) == "[12*<eos>(?)[12*34]<eos>(408)408<eos>"
    assert c.info["malformed_calls"] == 1 and c.info["tool_calls"] == 1 and groups[0].correct == [True]
    m = episode_metrics(groups)
    assert m["env/malformed_rate"] == 0.5 and m["env/turns_mean"] == 3


def test_reset_failure_drops_the_episode():
    made = []

    class FlakyReset(CalculatorEnv):
        def reset(self, problem):
            made.append(1)
            if len(made) == 2:
                raise ConnectionError("server down")
            return super().reset(problem)

    groups = run(lambda: FlakyReset(system_prompt=None), [P1], Scripted(TOK, agent), group_size=3)
    assert len(groups[0].completions) == 2 and groups[0].completions[0].info["reset_failures"] == 1


def test_qwen3_template_episode():
    tok, fmt = template_tokenizer("qwen3"), build_chat_format("qwen3")

    def reply(context):
        if context.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n"):
            return re.findall(r"<tool_response>\n(.*?)\n", context)[-1]
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'

    groups = run(lambda: CalculatorEnv(system_prompt=SYSTEM_PROMPT), [P1], Scripted(tok, reply), tok=tok, fmt=fmt,
                 limits=EpisodeLimits(max_turns=3, max_total_tokens=2048), sampling=Sampling(max_new_tokens=128))
    c = groups[0].completions[0]
    assert groups[0].correct == [True, True] and c.info["tool_calls"] == 1
    model_text = tok.decode([t for t, m in zip(c.token_ids, c.loss_mask) if m], skip_special_tokens=False)
    assert model_text == reply("") + "<|im_end|>408<|im_end|>"
    rows = conversation_rows(groups)
    assert rows[0]["conversation"].splitlines()[0].startswith("system:") and "tool: 408" in rows[0]["conversation"]


def test_environment_may_give_per_turn_reward_parts():
    class Shaped(CalculatorEnv):
        def step(self, message):
            r = super().step(message)
            return StepResult(r.messages, r.done, {**r.reward, "turn": -0.1}, r.correct, r.tool_errors)

    groups = run(lambda: Shaped(system_prompt=None), [P1], Scripted(TOK, agent), group_size=1)
    assert groups[0].components[0] == pytest.approx({"answer": 1.0, "turn": -0.2})
    assert groups[0].rewards[0] == pytest.approx(0.8)
    assert episode_metrics(groups)["env/reward/turn"] == pytest.approx(-0.2)
