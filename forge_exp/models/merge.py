"""`forge-exp-merge ADAPTER OUT [--base DIR]` (or `python -m forge_exp.models.merge`): a LoRA checkpoint merged into
its base and written as an HF checkpoint. A module of its own: it loads and saves through models/hf.py and
models/checkpoint.py, which build on models/lora.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from forge_exp.models.checkpoint import save_hf_checkpoint
from forge_exp.models.hf import load_causal_lm, load_tokenizer
from forge_exp.models.lora import ADAPTER_CONFIG, adapter_base, is_adapter_dir, merge_adapter


def merge_main(argv: list[str] | None = None) -> None:
    """`forge-exp-merge ADAPTER OUT [--base DIR]`: the adapter merged into its base, written as an HF checkpoint
    (weights, config.json, tokenizer) that transformers, vLLM and `model.path=` load as a plain model."""
    parser = argparse.ArgumentParser(prog="forge-exp-merge", description=merge_main.__doc__)
    parser.add_argument("adapter", help="a LoRA checkpoint: a directory with adapter_config.json")
    parser.add_argument("out", help="where to write the merged model")
    parser.add_argument("--base", help="the base model's directory (default: the adapter's base_model_name_or_path)")
    args = parser.parse_args(argv)
    if not is_adapter_dir(args.adapter):
        parser.error(f"{args.adapter} has no {ADAPTER_CONFIG}: not a LoRA checkpoint")
    base = args.base or adapter_base(args.adapter)
    if not base:
        parser.error(f"{args.adapter} was trained on a freshly initialised model: give its weights with --base")
    config = json.loads((Path(base).expanduser() / "config.json").read_text()) if Path(base).is_dir() else {}
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    model = merge_adapter(load_causal_lm(base, dtype=dtype), args.adapter)
    out = save_hf_checkpoint(model, load_tokenizer(args.adapter), args.out)
    print(f"forge-exp-merge: {args.adapter} merged into {base}: {out}")


if __name__ == "__main__":
    merge_main()
