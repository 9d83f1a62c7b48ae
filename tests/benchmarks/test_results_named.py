"""benchmarks/results/ holds what the pages stand on (STYLE.md 11): every file there is named by a page
(benchmarks/*.md, docs/*.md, README.md), and every results/ file a page names is there. A page may name files with
brace sets (`results/lora_h200_{lora,full}_1_7b.json`); a result's composed config beside it (`X_config.yaml`,
`X_forge_exp_config.yaml`) is named with `X.json`. A file no page stands on any more leaves results/; HISTORY.md
cites it as `<commit>:benchmarks/results/<name>`, which `git show` prints."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT

RESULTS = ROOT / "benchmarks" / "results"
PAGES = [*sorted((ROOT / "benchmarks").glob("*.md")), *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
KINDS = (".json", ".yaml", ".png", ".txt")
CONFIG = re.compile(r"^(.+?)(?:_forge_exp)?_config\.yaml$")
IN_GIT = re.compile(r"^([0-9a-f]{7,40}):(benchmarks/results/.+)$")


def expand(token: str) -> list[str]:
    """`a_{b,c}_{d,e}.json` → the four names it stands for (innermost set first, as the shell does)."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [n for alt in m[1].split(",") for n in expand(token[: m.start()] + alt + token[m.end():])]


def named() -> dict[str, list[str]]:
    """Every file name the pages write (brace sets expanded; trailing punctuation dropped) → the pages that do."""
    out: dict[str, list[str]] = {}
    for page in PAGES:
        for token in re.findall(r"[\w{},./:<>\[\]-]+", page.read_text()):
            for name in expand(token.rstrip(".,:;")):
                if name.endswith(KINDS) or "results/" in name:
                    out.setdefault(name, []).append(page.relative_to(ROOT).as_posix())
    return out


def test_every_result_file_is_named_by_a_page():
    basenames = {name.rsplit("/", 1)[-1] for name in named() if not IN_GIT.match(name)}
    unnamed = []
    for f in sorted(RESULTS.iterdir()):
        config = CONFIG.match(f.name)
        if f.name in basenames or (config and f"{config[1]}.json" in basenames):
            continue
        unnamed.append(f.name)
    assert not unnamed, (f"benchmarks/results/ holds {len(unnamed)} file(s) no page names: {unnamed}. Name each in the "
                         "claim it stands on (a brace set may name several), or git rm it and let HISTORY.md cite it "
                         "as <commit>:benchmarks/results/<name>")


def test_every_results_file_a_page_names_exists():
    names = named()
    cited = {m[2].rsplit("/", 1)[-1] for m in map(IN_GIT.match, names) if m}  # removed; HISTORY.md may still say them
    missing = []
    for name, pages in names.items():
        if IN_GIT.match(name) or "results/" not in name or name.endswith("/"):
            continue
        path = name[name.index("results/") + len("results/"):]
        if (RESULTS / path).is_file() or (set(pages) == {"benchmarks/HISTORY.md"} and path in cited):
            continue
        missing.append(f"{sorted(set(pages))}: {name}")
    assert not missing, ("pages name results/ files that are not in benchmarks/results/ (a placeholder such as <tag> "
                         "or [_x] must be written out, a brace set is fine; a removed file is cited as "
                         f"<commit>:benchmarks/results/<name>): {missing}")


def test_removed_results_are_cited_at_a_commit_that_holds_them():
    cited = sorted({name for name in named() if IN_GIT.match(name)})
    if not cited:
        pytest.skip("no page cites a removed result")
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True,
                         text=True, check=False)
    if git.returncode or git.stdout.strip() != "false":
        pytest.skip("not a full git clone: the cited commits cannot all be looked up")
    check = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch-check"], input="\n".join(cited) + "\n",
                           capture_output=True, text=True, check=True)
    missing = [line for line in check.stdout.splitlines() if line.endswith(" missing")]
    assert not missing, f"cited at a commit that does not hold them (or the commit is not in this clone): {missing}"
