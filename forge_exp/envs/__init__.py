"""Multi-turn, tool-using environments (pure: no monarch / mlflow / hydra).

    types.py       the protocol: Environment (reset / step / tools), ToolSpec, ToolCall, AssistantMessage,
                   StepResult, Sampling, EpisodeLimits (range-checked)
    driver.py      run_episodes(make_env, problems, group_size, generate, tokenizer, chat_format, sampling, limits)
                   -> list[Group], one Completion per episode with a per-token loss_mask
    formats.py     chat formats (tiny, qwen3, llama3): prompt / insertion token ids, tool-call parsing
    parsers.py     tool-call parsers for those formats
    calculator.py  CalculatorEnv, a calculator tool over safe_eval.py (an AST walk, no eval)
    local.py       local_generate(model, tokenizer): the driver's generate over an in-process model
    report.py      env/... metrics and whole conversations for the samples table
    openenv.py     adapter for OpenEnv environment servers          (extra: forge-exp[openenv])
    verifiers.py   adapter for Prime Intellect verifiers tasks      (extra: forge-exp[verifiers])
"""

from forge_exp.envs.calculator import CalculatorEnv
from forge_exp.envs.driver import GenerateFn, run_episodes
from forge_exp.envs.formats import ChatFormat, TemplateFormat, TinyToolFormat, build_chat_format
from forge_exp.envs.report import conversation_rows, episode_metrics
from forge_exp.envs.types import (
    AssistantMessage,
    Environment,
    EpisodeLimits,
    Message,
    Sampling,
    StepResult,
    ToolCall,
    ToolSpec,
)

__all__ = [
    "AssistantMessage",
    "CalculatorEnv",
    "ChatFormat",
    "Environment",
    "EpisodeLimits",
    "GenerateFn",
    "Message",
    "Sampling",
    "StepResult",
    "TemplateFormat",
    "TinyToolFormat",
    "ToolCall",
    "ToolSpec",
    "build_chat_format",
    "conversation_rows",
    "episode_metrics",
    "run_episodes",
]
