"""The README's Python examples run as written (they are the first code users copy)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples() -> None:
    assert len(python_blocks()) >= 5


def test_readme_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gymnasium")
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for block in python_blocks():  # later blocks reuse names from earlier ones
        exec(compile(block, str(README), "exec"), namespace)
    assert "restored" in namespace and "result" in namespace
