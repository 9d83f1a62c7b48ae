"""`model.dtype: auto`: bfloat16 where the hardware computes it natively, float32 elsewhere.

A CPU without native bf16 (AVX2 without AVX512-BF16 or AMX) emulates every bf16 matmul: one GRPO step of SmolLM2-135M
(4 prompts × 8 × 16 tokens) took 338 s there in bf16 and 14.8 s in float32, so a pretrained model asked to run "as
usual" on such a CPU runs in float32. GPUs (and CPUs with the instructions) keep bfloat16. No torch import: the CLI decides before processes start.
"""

from __future__ import annotations

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs that compute bf16 natively


def cpu_bf16_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The native-bf16 flags this CPU reports ([] where there are none, or no /proc/cpuinfo)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in BF16_CPU_FLAGS if flag in flags]


def auto_dtype(on_gpu: bool) -> tuple[str, str]:
    """(dtype, why) for `model.dtype: auto` on a run whose models are on GPUs (on_gpu) or on this CPU."""
    if on_gpu:
        return "bfloat16", "the models run on GPUs"
    flags = cpu_bf16_flags()
    if flags:
        return "bfloat16", f"this CPU computes bf16 natively ({', '.join(flags)})"
    return "float32", ("this CPU has no native bf16 (no avx512_bf16 or amx_bf16): bf16 would be emulated, many "
                       "times slower; model.dtype=bfloat16 forces it")
