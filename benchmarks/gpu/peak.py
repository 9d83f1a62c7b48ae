"""The two ceilings MFU and bandwidth numbers are taken against, measured on the machine the runs use (METHOD.md):
a dense bf16 matrix product and a device-to-device copy, on random data, warmed up, median of timed repeats.

    python benchmarks/gpu/peak.py --out peak.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch


def timed(fn, warmup: int = 3, repeats: int = 20) -> float:
    """Median seconds of fn() by CUDA events, after warm-up."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path)
    p.add_argument("--n", type=int, default=8192)
    args = p.parse_args()
    out = {"devices": []}
    for i in range(torch.cuda.device_count()):
        dev = torch.device(f"cuda:{i}")
        n = args.n
        a, b = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        src = torch.randn(2**30, device=dev, dtype=torch.float32)  # 4 GiB
        dst = torch.empty_like(src)
        with torch.cuda.device(dev):  # events time the current device's stream
            mm = timed(lambda: torch.matmul(a, b, out=c))
            cp = timed(lambda: dst.copy_(src), repeats=10)
        out["devices"].append({
            "index": i,
            "name": torch.cuda.get_device_name(dev),
            "bf16_matmul_tflops": 2 * n**3 / mm / 1e12,
            "matmul_shape": [n, n, n],
            "copy_tb_per_s": 2 * src.numel() * 4 / cp / 1e12,  # bytes read + bytes written
        })
        del a, b, c, src, dst
        torch.cuda.empty_cache()
    if torch.cuda.device_count() > 1:  # GPU 0 → GPU 1, what an IPC weight sync crosses
        src = torch.randn(2**28, device="cuda:0")  # 1 GiB
        dst = torch.empty(src.numel(), device="cuda:1")
        with torch.cuda.device(0):
            t = timed(lambda: dst.copy_(src), repeats=10)
        out["peer_copy_gb_per_s"] = src.numel() * 4 / t / 1e9
        out["peer_access"] = torch.cuda.can_device_access_peer(0, 1)
    out["torch"] = torch.__version__
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
