"""An environment whose every step hangs (imported by the environment workers' processes in
tests/actors/test_env_worker.py)."""

import time

from forge_exp.envs.calculator import CalculatorEnv


class HangingCalculator(CalculatorEnv):
    def step(self, message):
        time.sleep(30)  # far past env.tool_timeout_s: the turn fails, the worker goes on
        return super().step(message)
