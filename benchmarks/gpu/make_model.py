"""A randomly initialised model of Qwen3-1.7B's exact shape, a synthetic tokenizer with its full vocabulary, and a
jsonl task whose prompts are exactly --prompt-tokens long: what the GPU layout runs train on without downloading
anything (the GPU machines reach no network, and carrying 3.4 GB of weights is out of the question).

    python benchmarks/gpu/make_model.py --out /tmp/gpubench            # on the GPU machine: bf16 init on cuda
    python benchmarks/gpu/make_model.py --out /tmp/x --layers 2 --hidden 256 --intermediate 768   # a CPU check

Writes <out>/qwen3_1_7b/ (config.json, model.safetensors, tokenizer files with a chat template) and
<out>/data/{train,test}.jsonl. Then:

    forge-exp model.source=hf model.path=<out>/qwen3_1_7b model.dtype=bfloat16 \
        dataset=jsonl dataset.path=<out>/data/{split}.jsonl dataset.system_prompt=none ...

The shape is Qwen3-1.7B's config.json: hidden 2048, 28 layers, 16 query / 8 key-value heads of 128, MLP 6144, vocab
151936, tied embeddings, rope theta 1e6. The tokenizer is a whitespace WordLevel over 151936 synthetic words with
Qwen's special tokens at Qwen's ids (<|endoftext|> 151643 = pad, <|im_start|> 151644, <|im_end|> 151645 = EOS), so
every id the model can sample decodes, and prompt lengths are exact: one word, one token.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

VOCAB = 151936
SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
# ChatML, as Qwen's template renders it for plain user turns (no tools, no thinking switch)
CHAT_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def build_tokenizer(vocab_size: int = VOCAB):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [str(d) for d in range(10)] + ["system", "user", "assistant", "[UNK]"]
    vocab: dict[str, int] = {}
    for word in words:
        vocab[word] = len(vocab)
    special_ids = set(SPECIALS.values())
    i = 0
    while len(vocab) < vocab_size - len(SPECIALS):
        if len(vocab) in special_ids:  # keep Qwen's ids for the special tokens
            break
        vocab[f"w{i}"] = len(vocab)
        i += 1
    vocab.update(SPECIALS)
    while len(vocab) < vocab_size:  # the ids past the specials (Qwen's padded rows) decode too
        vocab[f"w{i}"] = len(vocab)
        i += 1
    assert sorted(vocab.values()) == list(range(vocab_size))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


# --shape: (layers, hidden, intermediate, query heads, tied embeddings) of the released config.json; kv heads 8 of 128
SHAPES = {"1.7b": (28, 2048, 6144, 16, True), "8b": (36, 4096, 12288, 32, False)}


def qwen3_1_7b_config(layers: int = 28, hidden: int = 2048, intermediate: int = 6144, heads: int = 16,
                      tied: bool = True):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=SPECIALS["<|im_end|>"],
        pad_token_id=SPECIALS["<|endoftext|>"],
    )


def write_model(out: Path, config, device: str, seed: int) -> dict:
    from transformers import Qwen3ForCausalLM

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)  # HF init: normal(0, 0.02) weights, unit norms
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    del model
    return {"parameters": n, "seconds": round(time.perf_counter() - t0, 1)}


def write_task(out: Path, tokenizer, prompt_tokens: int, train_rows: int, test_rows: int, seed: int) -> None:
    """Questions of synthetic words, sized so that the chat-formatted prompt is exactly prompt_tokens tokens."""
    from forge_exp.data.prompts import format_prompt

    overhead = len(tokenizer(format_prompt("", tokenizer, "none", True))["input_ids"])
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(1000, 100000)]
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train_rows), ("test", test_rows)):
        with open(out / f"{split}.jsonl", "w") as f:
            for _ in range(rows):
                question = " ".join(rng.choice(words) for _ in range(prompt_tokens - overhead))
                prompt = format_prompt(question, tokenizer, "none", True)
                n = len(tokenizer(prompt)["input_ids"])
                assert n == prompt_tokens, f"prompt has {n} tokens, wanted {prompt_tokens}"
                f.write(json.dumps({"question": question, "answer": "42"}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shape", choices=sorted(SHAPES), default="1.7b",
                   help="Qwen3-1.7B's (into <out>/qwen3_1_7b) or Qwen3-8B's (into <out>/qwen3_8b); the three below "
                        "shrink it")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--intermediate", type=int)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--train-rows", type=int, default=64)
    p.add_argument("--test-rows", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    model_dir = args.out / f"qwen3_{args.shape.replace('.', '_')}"
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(model_dir)
    layers, hidden, intermediate, heads, tied = SHAPES[args.shape]
    config = qwen3_1_7b_config(args.layers or layers, args.hidden or hidden, args.intermediate or intermediate,
                               heads, tied)
    info = write_model(model_dir, config, args.device, args.seed)
    write_task(args.out / "data", tokenizer, args.prompt_tokens, args.train_rows, args.test_rows, args.seed)
    print(json.dumps({"model": str(model_dir), "data": str(args.out / "data"), **info}))


if __name__ == "__main__":
    main()
