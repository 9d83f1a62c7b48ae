"""The pages can be found: README.md names every page under docs/, and benchmarks/README.md every page beside it."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("index, folder", [("README.md", "docs"), ("benchmarks/README.md", "benchmarks")])
def test_the_index_names_every_page(index, folder):
    text = (ROOT / index).read_text()
    pages = sorted(p.name for p in (ROOT / folder).glob("*.md") if p.name != "README.md")
    assert pages, folder
    missing = [p for p in pages if p not in text]
    assert not missing, f"{index} does not name these pages of {folder}/: {missing}"
