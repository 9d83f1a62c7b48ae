"""A small OpenEnv environment server for the adapter's tests: a calculator task with MCP tools, served by
OpenEnv's own app factory. Run: python -m uvicorn tests.envs.openenv_server:app --host 127.0.0.1 --port N

Tools: calculator(expression) (through forge_exp's safe evaluator), submit(answer) (scores against the target
given at reset and ends the episode), slow(seconds) (sleeps: a hanging tool), crash() (raises)."""

from __future__ import annotations

import time
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State

from forge_exp.envs.safe_eval import format_number, safe_eval


class CalculatorTask(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("calculator-task")
        self.target = ""
        self.submitted: str | None = None

        @mcp.tool()
        def calculator(expression: str) -> str:
            """Evaluate an arithmetic expression."""
            return format_number(safe_eval(expression))

        @mcp.tool()
        def submit(answer: str) -> str:
            """Submit the final answer."""
            self.submitted = answer.strip()
            return "submitted"

        @mcp.tool()
        def slow(seconds: float) -> str:
            """Sleep, then answer."""
            time.sleep(seconds)
            return "done"

        @mcp.tool()
        def crash() -> str:
            """Always fails."""
            raise RuntimeError("tool exploded")

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, question: str = "", target: str = "", **kwargs) -> Observation:
        self.target, self.submitted = target, None
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return Observation(done=False, reward=0.0, metadata={"question": question})

    async def step_async(self, action: Action, timeout_s=None, **kwargs) -> Observation:
        obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and action.tool_name == "submit" and isinstance(obs, CallToolObservation):
            correct = self.submitted == self.target
            obs = CallToolObservation(tool_name="submit", result=obs.result, error=obs.error, done=True,
                                      reward=1.0 if correct else 0.0)
        return obs

    def _step_impl(self, action: Action, timeout_s=None, **kwargs) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"unknown action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state


app = create_app(CalculatorTask, CallToolAction, CallToolObservation, env_name="calculator_task", max_concurrent_envs=64)
