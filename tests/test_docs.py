"""Every ```python block of the documentation site (``docs/``) runs, and its asserts hold.

The blocks of one page run in order in one namespace (a later block reuses names from an
earlier one, as a reader pasting a page into one session would), in a fresh temporary
working directory. The pages end their examples with asserts of what their text claims.

The migration guides (``docs/migration/*.md``) open with a "before / after" import block:
the lines marked ``# before`` (or following a ``# before`` comment line, up to ``# after``)
import the other library, which is not installed; they are checked to import the same names
as the ``# after`` lines, which run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_ext" not in p.parts)
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", flags=re.S | re.M)


def python_blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


def imported_names(lines: list[str]) -> set[str]:
    names: set[str] = set()
    for line in lines:
        m = re.match(r"\s*#?\s*from\s+\S+\s+import\s+(.*)", line)
        if m:
            code = m.group(1).split("#")[0]
            names |= {n.strip() for n in code.split(",") if n.strip()}
    return names


def split_before_after(block: str) -> tuple[list[str], list[str]]:
    """The lines a migration block replaces (``# before``) and the lines that run."""
    before: list[str] = []
    after: list[str] = []
    mode = "after"
    for line in block.splitlines():
        stripped = line.strip()
        if stripped == "# before":
            mode = "before"
            continue
        if stripped == "# after":
            mode = "after"
            continue
        if stripped.endswith("# before") or mode == "before" or re.match(r"#\s*from ", stripped):
            before.append(line)
        else:
            after.append(line)
    return before, after


def test_every_page_is_collected() -> None:
    names = {p.relative_to(DOCS).as_posix() for p in PAGES}
    assert {"index.md", "concepts.md", "guarantees.md", "benchmarks.md", "api.md",
            "migration/velora.md", "migration/fishyrl.md", "migration/pytorchrl.md",
            "migration/src.md"} <= names
    assert sum(len(python_blocks(p)) for p in PAGES) >= 25


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(page)
    if not blocks:
        pytest.skip("no python blocks")
    monkeypatch.chdir(tmp_path)
    state = np.random.get_state()
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    migration = page.parent.name == "migration"
    try:
        np.random.seed(0)
        for i, block in enumerate(blocks):
            if migration and i == 0:  # the "before / after" import block
                before, after = split_before_after(block)
                assert before and after, f"{page.name}: block {i} has no before/after lines"
                assert imported_names(before) == imported_names(after), page.name
                block = "\n".join(after) + "\n"
            exec(compile(block, f"{page}:block{i}", "exec"), namespace)
    finally:
        np.random.set_state(state)
