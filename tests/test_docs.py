"""Every code block of the documentation site (``docs/``) runs, and its asserts hold.

Every block is fenced ``python`` (it runs here) or ``bash`` (shell commands: installs and
benchmark runs, not Python). The Python blocks of one page run in order in one namespace (a
later block reuses names from an earlier one, as a reader pasting a page into one session
would), in a fresh temporary working directory. The pages end their examples with asserts of
what their text claims.

A block that needs an optional package says so in an HTML comment on the line before its
fence, invisible on the site: ``<!-- needs: ray -->`` (or ``<!-- needs: stable_baselines3,
torch -->``, import names). Such blocks run in a test of their own per page and set of
needs, ``page.md[ray]``, after the page's plain blocks; it is skipped where a package is
missing. Blocks that need Ray get the ``ray`` marker (``-m "not ray"`` leaves them out) and
run on the session's local Ray cluster (``tests/distributed_ray.py``).

The migration guides (``docs/migration/*.md``) open with a "before / after" import block:
the lines marked ``# before`` (or following a ``# before`` comment line, up to ``# after``)
import the other library, which is not installed; they are checked to import the same names
as the ``# after`` lines, which run.

``docs/api.md`` has an entry for every name of ``replaybank.__all__``
(:func:`test_api_reference_has_an_entry_for_every_public_name`).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.config import validate_config

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_ext" not in p.parts)
# a fenced block, with the "<!-- needs: ... -->" comment on the line before it, if any
FENCE = re.compile(r"^(?:<!--\s*needs:(?P<needs>[^>]*?)-->\n)?```(?P<lang>[^\s`]*)[^\n]*\n"
                   r"(?P<code>.*?)^```[ \t]*$", flags=re.S | re.M)
#: What a block that needs a package is marked with in the test run.
MARKS: dict[str, list[pytest.MarkDecorator]] = {"ray": [pytest.mark.ray]}


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    lang: str
    code: str
    needs: tuple[str, ...]  # import names of the optional packages it needs


def blocks(page: Path) -> list[Block]:
    return [Block(m["lang"], m["code"],
                  tuple(sorted(n.strip() for n in (m["needs"] or "").split(",") if n.strip())))
            for m in FENCE.finditer(page.read_text())]


def python_blocks(page: Path) -> list[str]:
    return [b.code for b in blocks(page) if b.lang == "python"]


def page_cases() -> list[Any]:
    """One case per page (its plain blocks), and one per page and set of needs."""
    cases = []
    for page in PAGES:
        name = page.relative_to(DOCS).as_posix()
        cases.append(pytest.param(page, (), id=name))
        for needs in sorted({b.needs for b in blocks(page) if b.lang == "python" and b.needs}):
            marks = [m for n in needs for m in MARKS.get(n, [])]
            cases.append(pytest.param(page, needs, id=f"{name}[{'+'.join(needs)}]",
                                      marks=marks))
    return cases


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
            "scaling.md", "integrations.md", "migration/velora.md", "migration/fishyrl.md",
            "migration/pytorchrl.md", "migration/src.md"} <= names
    assert sum(len(python_blocks(p)) for p in PAGES) >= 25


def test_integrations_page_has_an_example_per_extra() -> None:
    """Each integration's example runs where its extra is installed (``page.md[needs]``)."""
    page = DOCS / "integrations.md"
    needs = {n for b in blocks(page) if b.lang == "python" for n in b.needs}
    assert needs >= {"gymnasium", "torch", "stable_baselines3", "minari", "ray"}
    nav = (DOCS.parent / "mkdocs.yml").read_text()
    assert "integrations.md" in nav


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_every_block_is_python_that_runs_or_shell(page: Path) -> None:
    """No example hides from the tests behind a ``text`` fence (or none at all)."""
    text = page.read_text()
    assert text.count("```") == 2 * len(blocks(page)), f"{page.name}: unparsed fence"
    for i, block in enumerate(blocks(page)):
        where = f"{page.name} block {i} ({block.lang or 'no language'})"
        assert block.lang in ("python", "bash"), f"{where}: fence it as python or bash"
        if block.lang == "python":
            ast.parse(block.code)
            continue
        assert not block.needs, f"{where}: needs is for python blocks"
        try:
            ast.parse(block.code)
        except SyntaxError:
            continue
        raise AssertionError(f"{where}: this is Python; fence it as python so that it runs")


# Minari asks for metadata (author, description, ...) that a short example leaves out
@pytest.mark.filterwarnings("ignore:`\\w+` is set to None:UserWarning")
@pytest.mark.parametrize("page, needs", page_cases())
def test_page_blocks_run(page: Path, needs: tuple[str, ...], tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
                         ) -> None:
    selected = [b for b in blocks(page) if b.lang == "python" and set(b.needs) <= set(needs)]
    if not selected:
        pytest.skip("no python blocks")
    for name in needs:
        pytest.importorskip(name)
    if "ray" in needs:
        request.getfixturevalue("ray_cluster")  # the session's local cluster
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    state = np.random.get_state()
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    migration = page.parent.name == "migration"
    try:
        np.random.seed(0)
        for i, block in enumerate(selected):
            code = block.code
            if migration and i == 0:  # the "before / after" import block
                before, after = split_before_after(code)
                assert before and after, f"{page.name}: block {i} has no before/after lines"
                assert imported_names(before) == imported_names(after), page.name
                code = "\n".join(after) + "\n"
            exec(compile(code, f"{page}:block{i}", "exec"), namespace)
    finally:
        np.random.set_state(state)


# ------------------------------------------------------------------ the API reference

API = DOCS / "api.md"
DIRECTIVE = re.compile(r"^::: (?P<path>\S+)[ \t]*\n(?P<options>(?:[ \t]+\S.*\n)*)", re.M)


def _resolve(path: str) -> Any:
    """The object a ``::: path`` directive documents (a module, or a name in one)."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name != path:
            raise
    module, _, name = path.rpartition(".")
    return getattr(_resolve(module), name)


def documented_names() -> dict[str, list[Any]]:
    """Name -> the objects that ``docs/api.md`` documents under that name: each directive's
    object, and for a module directive (unless ``members: false``) the module's members as
    mkdocstrings renders them: its ``__all__``, else the public names it defines."""
    out: dict[str, list[Any]] = {}
    for m in DIRECTIVE.finditer(API.read_text()):
        path = m["path"]
        try:
            obj = _resolve(path)
        except ImportError as exc:  # an extra of the dev install is missing here
            pytest.skip(f"api.md documents {path}, which needs {exc.name}")
        out.setdefault(path.rpartition(".")[2], []).append(obj)
        if not inspect.ismodule(obj) or re.search(r"members:\s*false", m["options"]):
            continue
        names = getattr(obj, "__all__", None)
        if names is None:
            names = [n for n, v in vars(obj).items() if not n.startswith("_")
                     and getattr(v, "__module__", None) == obj.__name__]
        for name in names:
            out.setdefault(name, []).append(getattr(obj, name))
    return out


def _same(a: Any, b: Any) -> bool:
    """The same object, or the same class built twice (a config model derived on first use
    is built again after a test resets the model cache)."""
    return a is b or (isinstance(a, type) and isinstance(b, type)
                      and (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__))


def test_api_reference_has_an_entry_for_every_public_name() -> None:
    documented = documented_names()
    missing = [name for name in rb.__all__
               if not any(_same(obj, getattr(rb, name)) for obj in documented.get(name, []))]
    assert not missing, f"docs/api.md has no entry for rb.{', rb.'.join(missing)}"


def test_api_reference_directives_resolve() -> None:
    for m in DIRECTIVE.finditer(API.read_text()):
        try:
            _resolve(m["path"])
        except ImportError as exc:
            if exc.name not in ("stable_baselines3", "torch", "gymnasium", "minari", "ray"):
                raise


# ------------------------------------------------------------------ configs in the docs


def test_configs_name_samplers_and_views_by_class_name_too() -> None:
    """``{"type": "PrioritizedSampler"}`` (scaling.md) builds what ``"prioritized"`` does,
    and the config it gives back uses the registered name."""
    by_class = rb.from_config({"type": "ReplayBuffer", "capacity": 64, "n_step": 3,
                               "sampler": {"type": "PrioritizedSampler", "alpha": 0.7}})
    by_name = rb.from_config({"type": "ReplayBuffer", "capacity": 64, "n_step": 3,
                              "sampler": {"type": "prioritized", "alpha": 0.7}})
    assert type(by_class.sampler) is rb.PrioritizedSampler
    assert by_class.config() == by_name.config()
    assert by_class.config().sampler.type == "prioritized"
    nested = rb.from_config({"capacity": 8, "view": {
        "type": "FrameStackView", "k": 2, "inner": {"type": "NStepView", "n": 2}}})
    assert nested.config().view.model_dump()["inner"]["type"] == "nstep"
    recent = rb.from_config({"capacity": 8, "sampler": {
        "type": "RecentSampler", "prioritized": {"type": "PrioritizedSampler"}}})
    assert recent.config().sampler.model_dump()["prioritized"]["type"] == "prioritized"
    for kind, alias, name in [("sampler", "UniformSampler", "uniform"),
                              ("sampler", "LaneSplitSampler", "lane_split"),
                              ("view", "TransitionView", "transition"),
                              ("view", "HerView", "her")]:
        cfg = validate_config({"capacity": 8, kind: {"type": alias}})
        assert getattr(cfg, kind).type == name
    with pytest.raises(rb.ConfigError, match=r"unknown sampler type.*'PrioritizedSampler'"):
        rb.from_config({"capacity": 8, "sampler": {"type": "PrioritisedSampler"}})
