"""Chat formats: how a conversation becomes tokens, and how a model turn becomes an AssistantMessage.

The driver builds an episode's tokens incrementally and never re-tokenises what the model produced:

    prompt_ids(tok, opening messages, tools)    the first context, ending where the model starts writing
    [model turn: sampled ids, ending with a stop token from stop_ids(tok)]
    env_ids(tok, messages)                      what follows a finished model turn: the environment's messages,
                                                then the header of the next assistant turn
    ...

so the trainer's recomputed logprobs are of exactly the tokens that were sampled (a decode/re-encode round trip
can merge or split tokens differently, and the ratio would compare different sequences).

    TinyToolFormat    the tiny character model's own format: `<bos>1234*5678=[1234*5678]<eos>(7006652)7006652<eos>`
    TemplateFormat    any HF tokenizer with a chat template (Qwen3, Llama 3.x): prompts rendered by the tokenizer's
                      own template with `tools=`; the environment's insertions are the template's rendering of the
                      new messages after a finished assistant turn (rendered after a placeholder conversation and
                      cut at that assistant turn's end-of-turn marker, so the model's own text is never
                      re-rendered).
                      The tool-call parser is chosen by family: qwen3 (also Hermes-style templates), llama3.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from forge_exp.envs.parsers import parse_llama3, parse_qwen3, parse_tiny
from forge_exp.envs.types import AssistantMessage, Message, ToolSpec


class ChatFormat(Protocol):
    def prompt_ids(self, tokenizer: Any, messages: list[Message], tools: Sequence[ToolSpec]) -> list[int]: ...

    def env_ids(self, tokenizer: Any, messages: list[Message]) -> list[int]: ...

    def parse(self, tokenizer: Any, token_ids: list[int]) -> AssistantMessage: ...

    def stop_ids(self, tokenizer: Any) -> list[int]: ...


class TinyToolFormat:
    """The character model writes `[expression]` to call the (single) tool and ends each turn with <eos>; a tool
    result is inserted as `(value)`, an error as `(?)` (its text is outside the model's alphabet); a user message
    is inserted as its text. System messages and tool specs are not rendered: the tiny model learns the format from
    demonstrations (forge_exp/data/tool_arithmetic.py), not from instructions."""

    characters = "[]()?"  # what it writes besides the conversation's own text: the tokenizer must know them

    def __init__(self, tool: str = "calculator", argument: str = "expression") -> None:
        self.tool, self.argument = tool, argument

    def prompt_ids(self, tokenizer, messages, tools):
        text = "".join(m["content"] for m in messages if m["role"] == "user")
        return tokenizer(text)["input_ids"]  # <bos> + characters

    def env_ids(self, tokenizer, messages):
        parts = []
        for m in messages:
            if m["role"] == "tool":
                content = str(m["content"])
                ok = not content.startswith("error") and _in_vocab(tokenizer, content)
                parts.append(f"({content})" if ok else "(?)")
            elif m["role"] == "user":
                parts.append(m["content"])
        return tokenizer("".join(parts), add_special_tokens=False)["input_ids"] if parts else []

    def parse(self, tokenizer, token_ids):
        text = tokenizer.decode(token_ids, skip_special_tokens=True)
        return parse_tiny(text, self.tool, self.argument)

    def stop_ids(self, tokenizer):
        return [tokenizer.eos_token_id]


def _in_vocab(tokenizer, text: str) -> bool:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return bool(ids) and tokenizer.unk_token_id not in ids


PARSERS: dict[str, Callable[[str], AssistantMessage]] = {"qwen3": parse_qwen3, "llama3": parse_llama3}
# End-of-turn markers a model may stop on, by family (those the tokenizer knows are used).
END_OF_TURN = {"qwen3": ("<|im_end|>",), "llama3": ("<|eot_id|>", "<|eom_id|>")}


class TemplateFormat:
    """A real model's chat template. `family` picks the tool-call parser and the end-of-turn markers."""

    # A conversation whose assistant turn the insertion is cut after. Templates may render a turn differently once
    # it is no longer the last one (Qwen3 adds an empty <think></think> only to the last assistant turn), so the cut
    # is found in the rendering that includes the new messages, after the placeholder's own text.
    _SENTINEL = "PLACEHOLDERASSISTANTTURN"
    _PLACEHOLDER = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]

    def __init__(self, family: str) -> None:
        if family not in PARSERS:
            raise ValueError(f"env.chat_format: unknown template family {family!r}; one of {sorted(PARSERS)}")
        self.family = family
        self._parse = PARSERS[family]

    def _render(self, tokenizer, messages, tools=None, generation_prompt=False) -> str:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"env.chat_format={self.family} needs a tokenizer with a chat template; "
                f"{getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)} has none"
            )
        text = tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
        return text

    def prompt_ids(self, tokenizer, messages, tools):
        text = self._render(tokenizer, messages, [t.schema() for t in tools], generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def env_ids(self, tokenizer, messages):
        after = self._render(tokenizer, self._PLACEHOLDER + list(messages), generation_prompt=True)
        start = after.find(self._SENTINEL)
        marker = self._end_marker(tokenizer, after[start:]) if start >= 0 else None
        if marker is None:
            raise ValueError(f"the {self.family} chat template does not render an assistant turn's content and end "
                             "marker; its insertions cannot be computed")
        cut = after.index(marker, start) + len(marker)
        return tokenizer(after[cut:], add_special_tokens=False)["input_ids"]

    def _end_marker(self, tokenizer, rendered: str) -> str | None:
        """The end-of-turn marker that closes the first turn of `rendered`."""
        found = [(rendered.find(m), m) for m in (*END_OF_TURN[self.family], tokenizer.eos_token) if m and m in rendered]
        return min(found)[1] if found else None

    def parse(self, tokenizer, token_ids):
        stops = set(self.stop_ids(tokenizer))
        ids = token_ids[:-1] if token_ids and token_ids[-1] in stops else token_ids
        return self._parse(tokenizer.decode(ids, skip_special_tokens=False))

    def stop_ids(self, tokenizer):
        vocab = tokenizer.get_vocab()
        ids = [vocab[m] for m in END_OF_TURN[self.family] if m in vocab]
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
            ids.append(tokenizer.eos_token_id)
        return ids


def build_chat_format(name: str) -> ChatFormat:
    """`tiny` | `qwen3` | `llama3` (the `env.chat_format` key)."""
    if name == "tiny":
        return TinyToolFormat()
    if name in PARSERS:
        return TemplateFormat(name)
    raise ValueError(f"env.chat_format must be one of tiny, {', '.join(PARSERS)}; got {name!r}")
