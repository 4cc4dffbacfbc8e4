"""The optional C accelerator ``replaybank._lane``: loaded once, or None.

``replaybank/_lane.c`` is built at install time where a C compiler and the Python headers
exist (``setup.py``, ``optional=True``). It holds the compiled writer of
:func:`replaybank.storage.lane_writer.compiled_writer`, whose Python twin gives the same
results when the module is missing or when the environment variable
``REPLAYBANK_PURE_PYTHON=1`` switches it off (read at import).

(A compiled row gather for sampling was tried and dropped: with random keys over a
large ring, sampling is bound by memory latency, and numpy's ``take`` already reaches it.)

Example:
    >>> isinstance(accelerated(), bool)
    True
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["ACCEL", "accelerated"]


def _load() -> Any:
    if os.environ.get("REPLAYBANK_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("replaybank._lane")
    except ImportError:
        return None


ACCEL: Any = _load()


def accelerated() -> bool:
    """Whether the compiled paths (``replaybank._lane``) are built and switched on."""
    return ACCEL is not None
