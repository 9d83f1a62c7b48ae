"""The LoRA runs of run_lora.sh side by side: `python benchmarks/gpu/lora_table.py OUT` reads OUT/<tag>.json
(summarize.py) for each tag that ran, writes OUT/lora.json and prints a markdown table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

TAGS = {"lora_8b": "Qwen3-8B, LoRA r32", "lora_1_7b": "Qwen3-1.7B, LoRA r32", "full_1_7b": "Qwen3-1.7B, full"}
ROWS = (  # (label, summarize.py key, scale, format)
    ("step time (s)", "step_seconds", 1, "{:.2f}"),
    ("training (s)", "train_seconds", 1, "{:.2f}"),
    ("training tokens/s", "train_tokens_per_s", 1, "{:,.0f}"),
    ("generation tokens/s", "generation_tokens_per_s", 1, "{:,.0f}"),
    ("weight push (ms)", "weight_push_seconds", 1e3, "{:.1f}"),
    ("weight push (MiB)", "weight_push_bytes", 1 / 2**20, "{:,.1f}"),
    ("generator load (ms)", "generator_load_seconds", 1e3, "{:.1f}"),
    ("peak GPU memory (GiB)", "peak_gib", 1, "{:.1f}"),
    ("training MFU", "train_mfu", 100, "{:.1f}%"),
)


def peak_gib(result: dict) -> float | None:
    per_gpu = result.get("peak_used_mib_per_gpu") or {}  # summarize.py's memory() (nvidia-smi; none on CPU)
    return max(per_gpu.values()) / 1024 if per_gpu else None


def main() -> None:
    out = Path(sys.argv[1])
    runs = {tag: json.loads((out / f"{tag}.json").read_text()) for tag in TAGS if (out / f"{tag}.json").is_file()}
    for r in runs.values():
        r["peak_gib"] = peak_gib(r)
    table = {tag: {key: r.get(key) for _, key, _, _ in ROWS} for tag, r in runs.items()}
    (out / "lora.json").write_text(json.dumps({"runs": table, "commands": {t: r["command"] for t, r in runs.items()}},
                                              indent=1))
    print("| | " + " | ".join(TAGS[t] for t in runs) + " |")
    print("| --- |" + " --- |" * len(runs))
    for label, key, scale, fmt in ROWS:
        cells = [fmt.format(r[key] * scale) if isinstance(r.get(key), (int, float)) and r[key] == r[key] else "—"
                 for r in runs.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
