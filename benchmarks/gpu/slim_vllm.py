"""Rewrite a vLLM wheel without what one H200 never loads: the FlashAttention-2 kernels (Hopper uses
FlashAttention-3; vllm_flash_attn imports FA2 in a try) and the Rust HTTP frontend binary (vllm-rs, started only by
`vllm serve` with VLLM_USE_RUST_FRONTEND=1). RECORD loses their lines, so pip installs a consistent package.

    python benchmarks/gpu/slim_vllm.py .whl/dl/vllm-0.26.0-*.whl      # in place
"""

from __future__ import annotations

import os
import sys
import zipfile

DROP = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs")


def slim(path: str) -> None:
    tmp = path + ".slim"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        if not any(n in DROP for n in names):
            print(f"{path}: already slim")
            os.remove(tmp)
            return
        for info in src.infolist():
            if info.filename in DROP:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(l for l in data.splitlines(keepends=True) if l.split(b",")[0].decode() not in DROP)
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    os.replace(tmp, path)
    print(f"{path}: {os.path.getsize(path) / 1e6:.0f} MB")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        slim(p)
