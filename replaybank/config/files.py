"""Config files: a YAML or JSON file read into the mapping of buffer arguments it holds.

:func:`read_config_file` is what :func:`replaybank.from_config` does with a path. A file
holds the buffer's arguments at its top level, or under a ``buffer`` key beside other
sections of a larger config (a trainer's, say), which are left alone. Whatever a file
cannot mean is refused with a :class:`~replaybank.errors.ConfigError` naming the file and
the fix, never read in part or guessed at:

* a path that is missing, or a directory;
* a file that is not UTF-8 text, or cannot be read;
* a key given twice in one mapping (YAML and JSON parsers keep the last one silently, so an
  edit to the first would change nothing);
* a file, or a ``buffer`` section, that holds no mapping.

Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "buf.json"
    >>> _ = path.write_text('{"capacity": 64, "capacity": 128}')
    >>> read_config_file(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    replaybank.errors.ConfigError: config file ...buf.json: key 'capacity' is given twice; keep one
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from replaybank.errors import ConfigError, describe, require_extra

__all__ = ["SUFFIXES", "read_config_file"]

#: The file suffixes read (case-insensitive), and the parser of each.
SUFFIXES = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}
#: The key a larger config file keeps the buffer's arguments under.
SECTION = "buffer"


def _twice(path: Path, key: Any, where: str = "") -> ConfigError:
    return ConfigError(f"config file {path}: key {key!r} is given twice{where}; keep one")


@cache
def _yaml_loader() -> type:
    """PyYAML's safe loader, refusing a key given twice in one mapping."""
    yaml = require_extra("yaml", "yaml")

    class UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[name-defined,misc]
        path = Path()

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = lines.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                if first != key_node.start_mark.line + 1:
                    raise _twice(
                        self.path, key, f" (lines {first} and {key_node.start_mark.line + 1})"
                    )
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def _parse(path: Path, text: str, kind: str) -> Any:
    """``text`` parsed as ``kind`` (``"yaml"`` or ``"json"``), keys given twice refused."""
    if kind == "yaml":
        yaml = require_extra("yaml", "yaml")  # outside the try: its own error, with the fix
        loader = type("Loader", (_yaml_loader(),), {"path": path})
        try:
            return yaml.load(text, Loader=loader)  # a SafeLoader subclass: no tags run code
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: cannot parse ({exc})") from exc

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise _twice(path, key)
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path}: cannot parse ({exc})") from exc


def _not_a_mapping(path: Path, data: Any, section: bool = False) -> ConfigError:
    """The error of a file (or its ``buffer`` section) that holds no mapping."""
    yaml = SUFFIXES.get(path.suffix.lower()) == "yaml"
    if section:
        example = "buffer: {capacity: 100000}" if yaml else '{"buffer": {"capacity": 100000}}'
        return ConfigError(
            f"config file {path}: {SECTION}={describe(data)}: the {SECTION} "
            f"section must be a mapping of buffer arguments, e.g. {example}"
        )
    example = "capacity: 100000" if yaml else '{"capacity": 100000}'
    held = "is empty" if data is None else f"holds {describe(data)}"
    return ConfigError(
        f"config file {path} {held}: expected a mapping of buffer arguments "
        f"(at the top level or under a {SECTION} key), e.g. {example}"
    )


def _readable(path: Path) -> str:
    """The text of the file at ``path``, or the error that says why there is none."""
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix.lower() in SUFFIXES)
        hint = f"; it holds {', '.join(inside[:5])}" if inside else ""
        example = path / (inside[0] if inside else "buffer.yaml")
        raise ConfigError(f"config file {path} is a directory{hint}: pass the file, e.g. {example}")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it ({exc.strerror or exc})") from exc
    try:
        return data.decode("utf-8-sig")  # a byte order mark (Notepad) is no key
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte "
            f"{data[exc.start]:#04x} at offset {exc.start}); save it as UTF-8"
        ) from None


def read_config_file(path: Path) -> Mapping[str, Any]:
    """The buffer arguments a YAML or JSON config file holds.

    Args:
        path: A ``.yaml``, ``.yml`` or ``.json`` file (suffix case-insensitive).

    Returns:
        The mapping at the file's top level, or under its ``buffer`` key when it has one
        (the file's other keys then belong to other sections and are not read).

    Raises:
        ConfigError: The path is missing or a directory, the file cannot be read, is not
            UTF-8, has another suffix, does not parse, gives a key twice, or holds no
            mapping (itself or in its ``buffer`` section).
        MissingDependencyError: A YAML file, and PyYAML is not installed.
    """
    text = _readable(path)
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(
            f"config file {path}: unknown suffix {path.suffix!r}; use .yaml, .yml or .json"
        )
    data = _parse(path, text, kind)
    if isinstance(data, Mapping) and SECTION in data:
        data = data[SECTION]
        if not isinstance(data, Mapping):
            raise _not_a_mapping(path, data, section=True)
    if not isinstance(data, Mapping):
        raise _not_a_mapping(path, data)
    return data
