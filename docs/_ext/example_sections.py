"""Griffe extension for the docs build: read ``Example:`` as Google's ``Examples:`` section.

replaybank's docstrings title their doctest section ``Example:`` (singular). Griffe's
Google parser knows only ``Examples:``, and would render the ``>>>`` lines as Markdown,
where an index such as ``b.obs[new, 0]`` reads as a reference link. With the title
normalised, the section is rendered as a Python console code block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", flags=re.M)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
