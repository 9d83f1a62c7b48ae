"""Test tokenizers with chat templates written for these tests (Qwen3-like and Llama 3-like layouts, with Qwen3's
quirk: only the last assistant turn gets an empty <think></think> block), built offline: a character-level
vocabulary over printable ASCII plus each family's special tokens."""

from __future__ import annotations

import asyncio

from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from forge_exp.models.generate import Generation

QWEN_LIKE = """
{%- if tools or messages[0].role == 'system' %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}{% if tools %}Tools:{% for t in tools %}
{{ t | tojson }}{% endfor %}
Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>{% endif %}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{% if loop.last %}<think>

</think>

{% endif %}{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA_LIKE = """<|begin_of_text|>
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Respond with a JSON {"name": ..., "parameters": {...}} to call one of:{% for t in tools %}
{{ t | tojson }}{% endfor %}<|eot_id|>
{%- endif %}
{%- for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

FAMILIES = {
    "qwen3": (QWEN_LIKE, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"], ["<tool_call>", "</tool_call>"], "<|im_end|>"),
    "llama3": (LLAMA_LIKE, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                            "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"], [], "<|eot_id|>"),
}


def template_tokenizer(family: str) -> PreTrainedTokenizerFast:
    template, special, added, eos = FAMILIES[family]
    vocab = {"<unk>": 0}
    for ch in [chr(c) for c in range(32, 127)] + ["\n"]:
        vocab[ch] = len(vocab)
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", clean_up_tokenization_spaces=False)
    wrapped.add_special_tokens({"additional_special_tokens": special})
    wrapped.add_tokens(added)
    wrapped.eos_token = eos
    wrapped.pad_token = special[-1]
    wrapped.chat_template = template
    return wrapped


class Scripted:
    """A stand-in policy for driver tests: `reply(context_text) -> text` decides each turn; the generation is that
    text's tokens plus a stop token, with logprob -0.5 per token. Records every call (prompts, sampling)."""

    def __init__(self, tokenizer, reply, stop_id=None, delay: float = 0.0):
        self.tokenizer, self.reply, self.delay = tokenizer, reply, delay
        self.stop_id = tokenizer.eos_token_id if stop_id is None else stop_id
        self.calls = []

    async def __call__(self, prompts, sampling):
        self.calls.append(([list(p) for p in prompts], sampling))
        out = []
        for p in prompts:
            row = []
            for _ in range(sampling.n):
                text = self.reply(self.tokenizer.decode(p, skip_special_tokens=False))
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.stop_id]
                ids = ids[: sampling.max_new_tokens]
                stop = "eos" if ids[-1] == self.stop_id else "length"
                row.append(Generation(ids, [-0.5] * len(ids), stop))
            out.append(row)
        await asyncio.sleep(self.delay)
        return out
