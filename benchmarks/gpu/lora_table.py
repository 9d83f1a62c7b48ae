"""The LoRA runs of run_lora.sh side by side: `python benchmarks/gpu/lora_table.py OUT` reads OUT/<tag>.json
(summarize.py) for each tag that ran, writes OUT/lora.json and prints a markdown table."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from step_table import side_by_side  # noqa: E402

TAGS = {"lora_8b": "Qwen3-8B, LoRA r32", "lora_1_7b": "Qwen3-1.7B, LoRA r32", "full_1_7b": "Qwen3-1.7B, full"}
ROWS = ("step_seconds", "train_seconds", "train_tokens_per_s", "generation_tokens_per_s", "weight_push_seconds",
        "weight_push_bytes", "generator_load_seconds", "peak_gib", "train_mfu")


def main() -> None:
    side_by_side(Path(sys.argv[1]), TAGS, ROWS, "lora.json")


if __name__ == "__main__":
    main()
