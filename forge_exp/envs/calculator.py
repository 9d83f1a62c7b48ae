"""A calculator tool environment: answer an arithmetic question, with a `calculator(expression)` tool.

    user:       1234*5678=                        (the problem's prompt)
    assistant:  calls calculator("1234*5678")      -> tool: 7006652
    assistant:  7006652                            (a turn without a tool call is the final answer: scored, done)

Expressions go through envs/safe_eval.py (an AST walk over numbers and operators with bounds; no `eval`). A tool
that fails (bad expression, unknown tool, missing argument) answers with an error message and the episode goes
on: the model may try again while it has turns left. `tools_enabled=False` keeps the tool advertised but makes
every call an error — the "accuracy without the tool" measurement.
"""

from __future__ import annotations

from forge_exp.envs.safe_eval import EvalError, format_number, safe_eval
from forge_exp.envs.types import AssistantMessage, Message, StepResult, ToolCall, ToolSpec, tool_message
from forge_exp.rewards.arithmetic import ExactAnswerReward
from forge_exp.rl.types import Problem

CALCULATOR = ToolSpec(
    name="calculator",
    description="Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses) and return its value.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 1234*5678"}},
        "required": ["expression"],
    },
)

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Use the calculator tool for any computation, then reply with only the final "
    "number."
)


class CalculatorEnv:
    """One episode per instance (the driver builds one per sample). `answer_reward(prompt, response, target)` is any
    forge_exp reward function; it scores the final answer under the reward part "answer"."""

    tools = (CALCULATOR,)

    def __init__(
        self,
        answer_reward=None,
        *,
        tools_enabled: bool = True,
        system_prompt: str | None = None,  # env.system_prompt (config/env.py); SYSTEM_PROMPT suits larger models
        malformed_penalty: float = 0.0,
        tool_error_penalty: float = 0.0,
    ) -> None:
        if malformed_penalty < 0 or tool_error_penalty < 0:
            raise ValueError("env.malformed_penalty and env.tool_error_penalty are magnitudes: give them as >= 0")
        self.answer_reward = answer_reward or ExactAnswerReward(eos_text="")
        self.tools_enabled = tools_enabled
        self.system_prompt = system_prompt
        self.malformed_penalty = malformed_penalty
        self.tool_error_penalty = tool_error_penalty
        self.problem: Problem | None = None

    def reset(self, problem: Problem) -> list[Message]:
        self.problem = problem
        opening = [{"role": "user", "content": problem.prompt}]
        return ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + opening

    def step(self, message: AssistantMessage) -> StepResult:
        if self.problem is None:
            raise RuntimeError("CalculatorEnv.step before reset")
        if message.malformed is not None:
            reward = {"malformed": -self.malformed_penalty} if self.malformed_penalty else {}
            error = {"role": "tool", "name": CALCULATOR.name, "content": f"error: {message.malformed}"}
            return StepResult(messages=[error], reward=reward)
        if not message.tool_calls:  # the final answer
            score = float(self.answer_reward(self.problem.prompt, message.content, self.problem.target))
            return StepResult(done=True, reward={"answer": score}, correct=score >= 1.0)
        replies, errors = [], 0
        for call in message.tool_calls:
            text, ok = self._call(call)
            replies.append(tool_message(call, text))
            errors += not ok
        reward = {"tool_error": -self.tool_error_penalty * errors} if errors and self.tool_error_penalty else {}
        return StepResult(messages=replies, reward=reward, tool_errors=errors)

    def _call(self, call: ToolCall) -> tuple[str, bool]:
        if call.name != CALCULATOR.name:
            return f"error: unknown tool {call.name!r}; the only tool is {CALCULATOR.name}", False
        if not self.tools_enabled:
            return "error: the calculator is unavailable", False
        expression = call.arguments.get("expression")
        if not isinstance(expression, str):
            return "error: calculator needs an 'expression' string argument", False
        try:
            return format_number(safe_eval(expression)), True
        except EvalError as e:
            return f"error: {e}", False
