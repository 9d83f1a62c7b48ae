"""Prompt formatting with a chat template built here (no download) and with the plain template."""

import pytest
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from forge_exp.data.prompts import SYSTEM_PROMPTS, format_prompt

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_SYSTEM = (  # like Gemma's: refuses a system turn
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def make_tokenizer(chat_template: str | None = CHATML) -> PreTrainedTokenizerFast:
    """A word-level tokenizer (every word is one token, id 0) with an optional chat template. It declares no unknown
    token, so no prompt counts as unreadable (data/hf.py: check_prompt)."""
    tok = Tokenizer(WordLevel(vocab={"<unk>": 0, "<eos>": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", chat_template=chat_template)


def test_chat_template_renders_system_user_and_generation_prompt():
    prompt = format_prompt("What is 6*7?", make_tokenizer(), "Be brief.", use_chat_template=True)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_default_system_prompt_asks_for_think_and_answer_tags():
    prompt = format_prompt("What is 6*7?", make_tokenizer())
    assert "<think>" in prompt and "<answer>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert "\\boxed{}" in format_prompt("Q", make_tokenizer(), "boxed")


def test_no_system_prompt():
    prompt = format_prompt("Q", make_tokenizer(), "", use_chat_template=True)
    assert prompt == "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    assert format_prompt("Q", make_tokenizer(), "none") == prompt


def test_template_without_system_role_gets_instructions_in_the_user_turn():
    prompt = format_prompt("Q", make_tokenizer(NO_SYSTEM), "Be brief.")
    assert prompt == "<start_of_turn>user\nBe brief.\n\nQ<end_of_turn>\n<start_of_turn>model\n"


def test_plain_template():
    assert format_prompt("What is 6*7?", None, "Be brief.", use_chat_template=False) == (
        "Be brief.\n\nUser: What is 6*7?\nAssistant:"
    )
    assert format_prompt("Q", make_tokenizer(), "", use_chat_template=False) == "User: Q\nAssistant:"
    assert format_prompt("Q", None, "none", False, template="Q: {question}\nA:") == "Q: Q\nA:"
    assert format_prompt("Q", None, "think_answer", False).startswith(SYSTEM_PROMPTS["think_answer"])


def test_missing_chat_template_says_what_to_do():
    with pytest.raises(ValueError, match="no chat template: set dataset.use_chat_template=false"):
        format_prompt("Q", make_tokenizer(None), "x", use_chat_template=True)
    with pytest.raises(ValueError, match="no chat template"):
        format_prompt("Q", None, "x", use_chat_template=True)
