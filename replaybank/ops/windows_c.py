"""C kernel of window-batch row gathers (``replaybank._windows``;
:func:`replaybank.ops.windows.take_rows` is its numpy oracle).

:func:`take_rows` copies the rows of every field of a batch in one call (rows a few
steps ahead prefetched, the GIL released), instead of one ``ndarray.take`` per field.
Importing this module raises ImportError where the extension was not built (no C
compiler at install); :func:`replaybank.ops.windows.row_kernel` then takes the numpy
oracle. ``REPLAYBANK_PURE_PYTHON=1`` leaves it out too.

Example:
    >>> import numpy as np
    >>> src = np.arange(12, dtype=np.float32).reshape(6, 2)
    >>> out = np.empty((2, 2, 2), np.float32)
    >>> take_rows(((src, np.array([[5, 0], [1, 1]]), out),))
    >>> out[:, :, 0].tolist()
    [[10.0, 0.0], [2.0, 2.0]]
"""

from __future__ import annotations

import importlib
from typing import Any

# the C extension (ImportError where it was not built); loaded by name, as a module of
# this layer: the package root above it is not imported for it
_windows: Any = importlib.import_module("replaybank._windows")

__all__ = ["take_rows"]

#: ``take_rows(jobs)``: ``out[i] = src[idx[i]]`` for every ``(src, idx, out)`` of the
#: tuple ``jobs`` (same contract as :func:`replaybank.ops.windows.take_rows`).
take_rows: Any = _windows.take_rows
