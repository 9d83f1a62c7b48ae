"""What the tests of benchmarks/gpu/ share: an environment in which the scripts find this checkout's forge-exp, and
make_model.py's model at a tiny CPU shape."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

GPU = ROOT / "benchmarks" / "gpu"


def tiny_bench(bench: Path, *shape: str) -> dict[str, str]:
    """make_model.py's model and data in `bench` (shape: its --shape / --layers / ... arguments, a 24-token prompt,
    16 training rows, on the CPU); → the environment to run a benchmarks/gpu script against them."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "BENCH": str(bench),
           "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    make = [sys.executable, str(GPU / "make_model.py"), "--out", str(bench), *shape, "--prompt-tokens", "24",
            "--train-rows", "16", "--device", "cpu"]
    subprocess.run(make, check=True, capture_output=True, timeout=300, env=env)
    return env
