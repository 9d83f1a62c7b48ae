from forge_exp.envs.calculator import SYSTEM_PROMPT, CalculatorEnv
from forge_exp.envs.types import AssistantMessage, ToolCall
from forge_exp.rl.types import Problem

PROBLEM = Problem(prompt="12*34=", target="408", question="12*34")


def call(expr, name="calculator"):
    return AssistantMessage(content="", tool_calls=[ToolCall(name, {"expression": expr}, "c0")])


def test_tool_call_then_answer():
    env = CalculatorEnv(system_prompt=SYSTEM_PROMPT)
    opening = env.reset(PROBLEM)
    assert opening[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert opening[-1] == {"role": "user", "content": "12*34="}
    r = env.step(call("12*34"))
    assert not r.done and r.messages == [{"role": "tool", "name": "calculator", "tool_call_id": "c0", "content": "408"}]
    r = env.step(AssistantMessage(content="408"))
    assert r.done and r.correct and r.reward == {"answer": 1.0}
    r = env.step(AssistantMessage(content="407"))
    assert r.done and not r.correct and r.reward == {"answer": 0.0}


def test_errors_are_answers_not_exceptions():
    env = CalculatorEnv(tool_error_penalty=0.1, malformed_penalty=0.2)
    env.reset(PROBLEM)
    r = env.step(call("__import__('os')"))
    assert r.tool_errors == 1 and r.messages[0]["content"].startswith("error:") and r.reward == {"tool_error": -0.1}
    assert env.step(call("1", name="search")).tool_errors == 1
    r = env.step(AssistantMessage(content="[12*", malformed="unclosed"))
    assert not r.done and r.reward == {"malformed": -0.2} and "error" in r.messages[0]["content"]


def test_tools_disabled():
    env = CalculatorEnv(tools_enabled=False)
    env.reset(PROBLEM)
    r = env.step(call("12*34"))
    assert r.tool_errors == 1 and "unavailable" in r.messages[0]["content"]
