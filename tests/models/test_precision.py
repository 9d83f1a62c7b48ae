"""model.dtype=auto: bfloat16 on GPUs and CPUs that compute it natively, float32 elsewhere, with the reason."""

from forge_exp.models import precision


def cpuinfo(tmp_path, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\nflags\t\t: fpu sse2 {flags}\n")
    return str(path)


def test_native_bf16_flags_are_read_from_cpuinfo(tmp_path):
    assert precision.cpu_bf16_flags(cpuinfo(tmp_path, "avx2 avx512f avx512_bf16 amx_bf16")) == ["avx512_bf16", "amx_bf16"]
    assert precision.cpu_bf16_flags(cpuinfo(tmp_path, "avx2 avx512f")) == []
    assert precision.cpu_bf16_flags(str(tmp_path / "missing")) == []


def test_auto_picks_float32_on_a_cpu_without_bf16_and_says_why(tmp_path, monkeypatch):
    assert precision.auto_dtype(on_gpu=True) == ("bfloat16", "the models run on GPUs")
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: [])
    dtype, why = precision.auto_dtype(on_gpu=False)
    assert dtype == "float32" and "no native bf16" in why and "model.dtype=bfloat16" in why
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ["amx_bf16"])
    assert precision.auto_dtype(on_gpu=False) == ("bfloat16", "this CPU computes bf16 natively (amx_bf16)")
