"""The C modules' build (setup.py) under the flags other interpreters give: Debian's and
other distributions' Pythons compile extensions at ``-O2``, where GCC leaves the writer's
strided copies and casts unvectorised, so the build asks for ``-O3`` itself, unless the
user's ``CFLAGS`` names an optimisation level. A stand-in compiler records each command
(and makes the files it is asked for), so nothing is compiled and the package's own
modules are not touched."""

from __future__ import annotations

import ast
import email
import importlib.metadata
import os
import re
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _setuptools_major() -> int:
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0


# setup.py run directly reads pyproject.toml with the installed setuptools; pip builds in
# isolation with the build requirement (setuptools>=77), which older ones cannot read
pytestmark = pytest.mark.skipif(
    _setuptools_major() < 77, reason="running setup.py needs setuptools>=77 installed"
)

FAKE_CC = """#!/bin/sh
echo "$@" >> "{log}"
while [ $# -gt 0 ]; do
    if [ "$1" = "-o" ]; then mkdir -p "$(dirname "$2")"; : > "$2"; fi
    shift
done
"""


def _stand_in_cc(tmp_path: Path, script: str) -> Path:
    """An executable shell ``script`` at ``tmp_path / "cc"``: the compiler a build runs."""
    cc = tmp_path / "cc"
    cc.write_text(script)
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    return cc


def _build_ext(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``setup.py build_ext --force`` with ``env``, its modules and objects under
    ``tmp_path`` (``lib``, ``tmp``); not checked (the caller reads the status)."""
    return subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--force", "-b", str(tmp_path / "lib"),
         "-t", str(tmp_path / "tmp")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


def _compile_lines(tmp_path: Path, cflags: str) -> list[str]:
    """The compile commands of ``setup.py build_ext`` with ``CFLAGS=cflags`` (which
    replace the interpreter's flags), the compiler named with ``-O2`` as Debian's
    interpreter names it."""
    log = tmp_path / "cc.log"
    cc = _stand_in_cc(tmp_path, FAKE_CC.format(log=log))
    env = {**os.environ, "CC": f"{cc} -O2", "LDSHARED": f"{cc} -shared", "CFLAGS": cflags}
    done = _build_ext(tmp_path, env)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in log.read_text().splitlines() if " -c " in ln]
    assert {Path(ln.split(" -c ")[1].split()[0]).name for ln in lines} >= {
        "_lane.c",
        "_sampling.c",
        "_windows.c",
    }
    return lines


@pytest.mark.skipif(sys.platform == "win32", reason="a Unix compiler's flags")
def test_the_c_modules_are_built_at_o3_under_an_o2_interpreter(tmp_path: Path) -> None:
    lines = _compile_lines(tmp_path, "-Wall -g")
    for ln in lines:  # the last optimisation level named is the one GCC and Clang use
        assert [a for a in ln.split() if a.startswith("-O")][-1] == "-O3", ln


@pytest.mark.skipif(sys.platform == "win32", reason="a Unix compiler's flags")
def test_cflags_naming_a_level_are_kept(tmp_path: Path) -> None:
    lines = _compile_lines(tmp_path, "-O0 -g")
    for ln in lines:
        assert [a for a in ln.split() if a.startswith("-O")][-1] == "-O0", ln


@pytest.mark.skipif(sys.platform == "win32", reason="a Unix compiler's flags")
def test_each_c_module_compiles_to_its_own_object_file(tmp_path: Path) -> None:
    """``_lane`` and its kill-point build (``_lane_killpoints``) come from one source: each
    needs an object file of its own, or a parallel build (``build_ext -j``) can link one
    module from the other's object."""
    lines = _compile_lines(tmp_path, "-O3")
    objects = [ln.split(" -o ")[1].split()[0] for ln in lines]
    assert len(objects) == 4 and len(set(objects)) == 4, objects


FAILING_CC = """#!/bin/sh
echo "cc: no compiler here" >&2
exit 1
"""


@pytest.mark.skipif(sys.platform == "win32", reason="a Unix compiler")
def test_a_build_without_a_compiler_succeeds_and_says_so_once(tmp_path: Path) -> None:
    """No C compiler (or no Python headers): the build still succeeds (the modules are
    optional) and says once, in one line after the compiler's errors, that replaybank
    works without them and how to get them."""
    cc = _stand_in_cc(tmp_path, FAILING_CC)
    done = _build_ext(tmp_path, {**os.environ, "CC": str(cc), "LDSHARED": f"{cc} -shared"})
    assert done.returncode == 0, done.stderr
    assert not list((tmp_path / "lib").rglob("*.so"))
    said = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.startswith("replaybank: ")]
    assert len(said) == 1, said
    assert "C modules _lane, _sampling, _windows, _lane_killpoints were not built" in said[0]
    assert "works without them" in said[0] and "build-essential python3-dev" in said[0]
    assert "replaybank --version" in said[0]


# --- what the sdist and the wheel hold ------------------------------------------------------

#: Built or cached in place, never shipped.
STRAY = re.compile(r"(^|/)(__pycache__|\.hypothesis|\.pytest_cache|build|dist)/|\.(so|pyc|o)$")


def _source_files(*folders: str) -> set[str]:
    """The files under ``folders`` (relative to the repository root), less what is built
    or cached in place."""
    return {
        p.relative_to(ROOT).as_posix()
        for folder in folders
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and not STRAY.search(p.relative_to(ROOT).as_posix())
    }


def _setup(tmp_path: Path, *commands: str, cc: str | None = None) -> None:
    """``setup.py`` run with ``commands``, everything it writes kept under ``tmp_path``
    (egg-info and build folders too), with the stand-in compiler when ``cc`` is given."""
    (tmp_path / "egg").mkdir()
    env = dict(os.environ)
    if cc is not None:
        env.update(CC=cc, LDSHARED=f"{cc} -shared")
    subprocess.run(
        [
            sys.executable,
            "setup.py",
            "-q",
            "egg_info",
            "--egg-base",
            str(tmp_path / "egg"),
            *commands,
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )


def test_the_sdist_is_the_whole_source_release(tmp_path: Path) -> None:
    """The sdist holds the C sources and the header, ``py.typed``, and everything the test
    suite reads (the tests' helper modules and data, the root conftest.py, docs, examples,
    benchmarks), so the suite runs from the unpacked sdist; nothing built in place."""
    _setup(tmp_path, "sdist", "--dist-dir", str(tmp_path / "dist"))
    (sdist,) = (tmp_path / "dist").glob("replaybank-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = _source_files("replaybank", "tests", "docs", "examples", "benchmarks") | {
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "setup.py",
        "conftest.py",
        "mkdocs.yml",
        "PKG-INFO",
    }
    assert {
        "replaybank/_lane.c",
        "replaybank/_lane_killpoints.c",
        "replaybank/_sampling.c",
        "replaybank/_windows.c",
        "replaybank/_fastdiv.h",
        "replaybank/py.typed",
        "tests/__init__.py",
        "tests/roundtrip.py",
        "tests/distributed_ray.py",
    } <= wanted
    assert sorted(wanted - names) == []
    assert sorted(n for n in names if STRAY.search(n)) == []


def test_the_wheel_holds_the_package_its_types_and_metadata(tmp_path: Path) -> None:
    """The wheel holds the package (its compiled modules, ``py.typed``, no C sources, tests,
    docs or examples), the ``replaybank`` console script, and metadata a package index
    shows: version, Python requirement, licence, classifiers. The stand-in compiler makes
    empty modules, so nothing is compiled."""
    cc = tmp_path / "cc"
    cc.write_text(FAKE_CC.format(log=tmp_path / "cc.log"))
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    _setup(
        tmp_path,
        "build",
        "--build-base",
        str(tmp_path / "build"),
        "bdist_wheel",
        "--bdist-dir",
        str(tmp_path / "bdist"),
        "--dist-dir",
        str(tmp_path / "dist"),
        cc=str(cc),
    )
    (wheel,) = (tmp_path / "dist").glob("replaybank-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(zf.read(f"{info}/METADATA"))
        scripts = zf.read(f"{info}/entry_points.txt").decode()
    package = {n for n in _source_files("replaybank") if n.endswith(".py")} | {
        "replaybank/py.typed"
    }
    assert sorted(package - names) == []
    assert {n.split(".")[0] for n in names if n.endswith(".so")} == {
        f"replaybank/{m}" for m in ("_lane", "_lane_killpoints", "_sampling", "_windows")
    }
    assert sorted(n for n in names if not n.startswith(("replaybank/", info + "/"))) == []
    assert sorted(n for n in names if n.endswith((".c", ".h", ".pyc"))) == []
    assert "replaybank = replaybank.cli.main:main" in scripts
    assert f"{info}/licenses/LICENSE" in names
    assert meta["Name"] == "replaybank" and meta["License-Expression"] == "MIT"
    init = (ROOT / "replaybank" / "__init__.py").read_text()
    assert f'__version__ = "{meta["Version"]}"' in init
    assert meta["Requires-Python"] == ">=3.10"
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.10" in classifiers


def test_the_minari_extra_installs_what_minari_imports_to_store_datasets() -> None:
    """minari 0.5.4 imports PIL in its HDF5 dataset storage without declaring pillow, so in
    a venv with only ``replaybank[minari]`` both ``from_minari`` and ``to_minari`` failed
    (``No module named 'PIL'``; a dev install has pillow through matplotlib). Every
    third-party module that minari's storage, datasets and data collector import comes from
    minari's requirements (with the ``create`` and ``hdf5`` extras) or from the extra."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    minari = pytest.importorskip("minari")
    requirements = pytest.importorskip("packaging.requirements")
    utils = pytest.importorskip("packaging.utils")
    folder = Path(minari.__file__).parent
    files = [
        folder / "dataset" / "_storages" / "hdf5_storage.py",
        folder / "utils.py",
        *(folder / "dataset").glob("*.py"),
        *(folder / "data_collector").glob("*.py"),
    ]
    imported: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    with open(ROOT / "pyproject.toml", "rb") as f:
        ours = tomllib.load(f)["project"]["optional-dependencies"]["minari"]
    declared = {utils.canonicalize_name(requirements.Requirement(r).name) for r in ours}
    for line in importlib.metadata.requires("minari") or []:
        req = requirements.Requirement(line)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("create", "hdf5")):
            declared.add(utils.canonicalize_name(req.name))
    dists = importlib.metadata.packages_distributions()
    third_party = sorted(imported - set(sys.stdlib_module_names) - {"minari"})
    missing = [
        m
        for m in third_party
        if not {utils.canonicalize_name(d) for d in dists.get(m, [])} & declared
    ]
    assert missing == [], (missing, sorted(declared))
    assert "pillow" in declared  # (for PIL, which minari 0.5.4 imports but does not declare)
