"""CPU vs GPU parity of the losses, the trainer's logprobs and update, and the generator (benchmarks/gpu/parity.py).
Runs where CUDA exists (the lent GPU machines); CI has none and skips it. There, with the installed package (whose
forge_exp.conf the losses are composed from) ahead of the tree's:

    source benchmarks/gpu/install.sh && pytest -q --import-mode=append tests/gpu
"""

import importlib.util

import pytest
import torch

from tests.conftest import ROOT


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_matches_cpu_within_bf16_tolerance():
    spec = importlib.util.spec_from_file_location("parity", ROOT / "benchmarks" / "gpu" / "parity.py")
    parity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parity)
    assert parity.main([]) == 0
