"""The verifiers adapter on a small verifiers (v1) taskset built here: a Toolset with a calculator tool, a task
scored by its own @vf.reward over the finished trace, driven by forge_exp's episode loop."""

import asyncio
import re

import pytest

vf = pytest.importorskip("verifiers.v1")

from forge_exp.envs import EpisodeLimits, Sampling, TinyToolFormat, episode_metrics, run_episodes  # noqa: E402
from forge_exp.envs.safe_eval import format_number, safe_eval  # noqa: E402
from forge_exp.envs.verifiers import VerifiersTaskEnv, verifiers_problems  # noqa: E402
from forge_exp.models.tokenizer import TOOL_ALPHABET, build_char_tokenizer  # noqa: E402
from tests.envs.helpers import Scripted  # noqa: E402


class CalcTools(vf.Toolset):
    @vf.tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression."""
        if expression == "0/0":
            raise ZeroDivisionError("0/0")
        return format_number(safe_eval(expression))


class CalcData(vf.TaskData):
    answer: str = ""


class CalcTask(vf.Task[CalcData]):
    @classmethod
    def toolsets(cls, config):
        return [CalcTools(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.reward(weight=0.5)
    async def used_tool(self, trace) -> float:
        return float(len(trace.tool_messages) > 0)


class CalcTaskset(vf.Taskset[CalcTask]):
    def load(self):
        for q, a in [("12*34", "408"), ("99*99", "9801"), ("0/0", "0")]:
            yield CalcTask(CalcData(prompt=f"{q}=", answer=a), self.config.task)


def test_verifiers_task_scored_by_its_own_rewards():
    taskset = CalcTaskset(vf.TasksetConfig(id="calc"))
    problems = verifiers_problems(taskset)
    assert [p.prompt for p in problems] == ["12*34=", "99*99=", "0/0="]
    tok = build_char_tokenizer(TOOL_ALPHABET)
    wrong = {"99*99": True}

    def agent(context):
        if context.endswith("(?)"):
            return "0"
        if context.endswith(")"):
            result = re.findall(r"\((\d+)\)", context)[-1]
            return "9800" if "99*99" in context and wrong.pop("99*99", False) else result
        return "[" + context.removeprefix("<bos>").rstrip("=") + "]"

    groups = asyncio.run(run_episodes(lambda: VerifiersTaskEnv(taskset), problems, 2, Scripted(tok, agent), tok,
                                      TinyToolFormat(), Sampling(max_new_tokens=16), EpisodeLimits(3, 64, 5.0)))
    assert groups[0].rewards == [1.5, 1.5] and groups[0].components[0] == {"correct": 1.0, "used_tool": 0.5}
    assert groups[0].correct == [True, True]
    assert sorted(groups[1].rewards) == [0.5, 1.5]  # one sample answered 9800: only the tool-use reward
    raised = groups[2].completions[0]  # the tool raised: an error reply, and the episode went on
    assert raised.info["tool_errors"] == 1 and tok.decode(raised.token_ids) == "[0/0]<eos>(?)0<eos>"
    assert groups[2].rewards[0] == 1.5
    assert episode_metrics(groups)["env/reward/used_tool"] == 0.5


def test_tool_schema_and_unknown_task():
    taskset = CalcTaskset(vf.TasksetConfig(id="calc"))
    env = VerifiersTaskEnv(taskset)
    env.reset(verifiers_problems(taskset)[0])
    (spec,) = env.tools
    assert spec.name == "calculator" and spec.parameters["properties"]["expression"]["type"] == "string"
    assert spec.parameters["required"] == ["expression"]
    with pytest.raises(KeyError, match="verifiers_problems"):
        env.reset(type(verifiers_problems(taskset)[0])("1=", "no-such-key"))
