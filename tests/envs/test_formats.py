import json

import pytest

from forge_exp.envs.calculator import CALCULATOR
from forge_exp.envs.formats import TemplateFormat, TinyToolFormat, build_chat_format
from forge_exp.models.tokenizer import TOOL_ALPHABET, build_char_tokenizer
from tests.envs.helpers import template_tokenizer

TOOL_RESULT = [{"role": "tool", "name": "calculator", "tool_call_id": "c0", "content": "408"}]


def test_tiny_format_round_trip():
    tok, fmt = build_char_tokenizer(TOOL_ALPHABET), TinyToolFormat()
    prompt = fmt.prompt_ids(tok, [{"role": "system", "content": "ignored"}, {"role": "user", "content": "12*34="}], [CALCULATOR])
    assert tok.decode(prompt) == "<bos>12*34="
    turn = tok("[12*34]", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    msg = fmt.parse(tok, turn)
    assert msg.tool_calls[0].arguments == {"expression": "12*34"}
    assert tok.decode(fmt.env_ids(tok, TOOL_RESULT)) == "(408)"
    assert tok.decode(fmt.env_ids(tok, [{"role": "tool", "content": "error: division by zero"}])) == "(?)"
    assert fmt.stop_ids(tok) == [tok.eos_token_id]


def test_default_alphabet_ids_unchanged_by_the_tool_characters():
    base, tools = build_char_tokenizer(), build_char_tokenizer(TOOL_ALPHABET)
    assert all(tools.get_vocab()[k] == v for k, v in base.get_vocab().items())


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_template_prompt_carries_tools_and_ends_at_the_assistant_header(family):
    tok, fmt = template_tokenizer(family), build_chat_format(family)
    ids = fmt.prompt_ids(tok, [{"role": "user", "content": "12*34?"}], [CALCULATOR])
    text = tok.decode(ids, skip_special_tokens=False)
    assert json.dumps(CALCULATOR.schema()["function"]["name"]) in text and "12*34?" in text
    header = {"qwen3": "<|im_start|>assistant\n", "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n"}[family]
    assert text.endswith(header)


@pytest.mark.parametrize(
    "family, expected",
    [("qwen3", "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
     ("llama3", "<|start_header_id|>ipython<|end_header_id|>\n\n408<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")],
)
def test_template_insertion_is_what_follows_the_end_of_turn(family, expected):
    tok, fmt = template_tokenizer(family), build_chat_format(family)
    assert tok.decode(fmt.env_ids(tok, TOOL_RESULT), skip_special_tokens=False) == expected


def test_incremental_tokens_equal_the_template_rendering_of_the_whole_conversation():
    """prompt + model turn (ending at <|im_end|>) + insertion == the template's rendering of the conversation."""
    tok, fmt = template_tokenizer("qwen3"), TemplateFormat("qwen3")
    opening = [{"role": "user", "content": "12*34?"}]
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'
    turn = tok(call, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = fmt.prompt_ids(tok, opening, [CALCULATOR]) + turn + fmt.env_ids(tok, TOOL_RESULT)
    msg = fmt.parse(tok, turn)
    assert msg.tool_calls[0].arguments == {"expression": "12*34"} and msg.content == ""
    full = tok.apply_chat_template(opening + [msg.to_dict()] + TOOL_RESULT, tools=[CALCULATOR.schema()],
                                   tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids, skip_special_tokens=False) == full


def test_template_stop_ids_and_errors():
    tok = template_tokenizer("llama3")
    vocab = tok.get_vocab()
    assert set(TemplateFormat("llama3").stop_ids(tok)) == {vocab["<|eot_id|>"], vocab["<|eom_id|>"]}
    with pytest.raises(ValueError, match="env.chat_format"):
        build_chat_format("mistral")
    plain = build_char_tokenizer()
    with pytest.raises(ValueError, match="chat template"):
        TemplateFormat("qwen3").prompt_ids(plain, [{"role": "user", "content": "1"}], [])
