"""Turning a question into the text the model sees: the tokenizer's chat template, or a plain template.

`system_prompt` in config is either a preset name below or the literal text; "" (or "none") sends no system
message. The presets ask for the format that the rewards in conf/reward/ check — keep them in step:

    think_answer   reasoning in <think></think>, final answer in <answer></answer>   (reward=math_thinking)
    boxed          reasoning in <think></think>, final answer in \\boxed{}           (MATH-style graders)
    answer         the final answer in <answer></answer>, no reasoning asked for      (reward=reasoning_gym)

`examples` (few-shot) are solved (question, response) pairs shown before the question: earlier user and assistant
turns of the chat, or filled templates of their own without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError  # what chat templates raise, e.g. "System role not supported"

SYSTEM_PROMPTS = {
    "think_answer": (
        "You are a helpful assistant. First reason about the problem step by step inside <think> </think> tags, "
        "then give only the final answer inside <answer> </answer> tags, e.g. "
        "<think> reasoning here </think> <answer> 42 </answer>."
    ),
    "boxed": (
        "You are a helpful assistant. First reason about the problem step by step inside <think> </think> tags, "
        "then give the final answer in \\boxed{}, e.g. <think> reasoning here </think> The answer is \\boxed{42}."
    ),
    "answer": "Answer the question. Write the final answer inside <answer> </answer> tags.",
    "none": "",
}

# For base models without a chat template (the R1-Zero setup): the model continues after "Assistant:".
PLAIN_TEMPLATE = "{system}User: {question}\nAssistant:"


def resolve_system_prompt(system_prompt: str) -> str:
    """A preset's text, or `system_prompt` itself when it is not a preset name."""
    return SYSTEM_PROMPTS.get(system_prompt, system_prompt)


def format_prompt(
    question: str,
    tokenizer: Any = None,
    system_prompt: str = "think_answer",
    use_chat_template: bool | None = True,
    template: str = PLAIN_TEMPLATE,
    examples: Sequence[tuple[str, str]] = (),
) -> str:
    """The prompt text for one question, after the solved `examples` (question, response).

    use_chat_template=None means: when the tokenizer has one. With it, the tokenizer's own template renders [system, user] with the generation prompt
    appended (models whose template refuses a system role get the system text at the top of the user turn).
    Without, `template` is filled with `{system}` (the system text and a blank line, or nothing) and `{question}`.
    """
    system = resolve_system_prompt(system_prompt)
    if use_chat_template is None:
        use_chat_template = bool(getattr(tokenizer, "chat_template", None))
    if not use_chat_template:
        if "{question}" not in template:
            raise ValueError(f"prompt template {template!r} has no {{question}} placeholder")
        shots = "".join(f"{template.format(system='', question=q)} {a}\n\n" for q, a in examples)
        return template.format(system=(f"{system}\n\n" if system else "") + shots, question=question)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"dataset.use_chat_template=true but the tokenizer ({name}) has no chat template: "
            f"set dataset.use_chat_template=false to use the plain 'User: ... Assistant:' template"
        )
    turns = [m for q, a in examples for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]
    turns.append({"role": "user", "content": question})
    try:
        return _render(tokenizer, ([{"role": "system", "content": system}] if system else []) + turns)
    except TemplateError:
        if not system:
            raise
        # e.g. Gemma's template: "System role not supported". Fold the instructions into the first user turn.
        first = {"role": "user", "content": f"{system}\n\n{turns[0]['content']}"}
        return _render(tokenizer, [first, *turns[1:]])


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):  # guards against a transformers default changing under us
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
    return text
