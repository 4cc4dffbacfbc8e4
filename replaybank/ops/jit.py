"""Choosing between a compiled kernel (C or numba) and its numpy oracle.

Every compiled kernel in replaybank has a pure-numpy twin with the same signature and
results (the tests check them against each other). :func:`pick_kernel` returns, for
``prefer="auto"``, the C kernel where one exists and was built (no JIT: nothing to
compile or load on first use), else the numba kernel when numba imports, else numpy.
``REPLAYBANK_PURE_PYTHON=1`` in the environment (read per call) leaves the C kernels out,
as on a machine without a C compiler. It is the one chooser: a compiled module that has no
numba twin (the compiled writer, ``replaybank._lane``) is picked with it too
(``module=None, attr=None``: the C module itself, or None).

Example:
    >>> import numpy as np
    >>> pick_kernel("numpy", "replaybank.ops.stack_numba", "stack_slots", np.sum, "k")[1]
    'numpy'
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["PREFERENCES", "pick_kernel", "pure_python"]

PREFERENCES = ("auto", "c", "numba", "numpy")


def pure_python() -> bool:
    """Whether ``REPLAYBANK_PURE_PYTHON`` switches the C kernels off (set, and not ``0``).

    Example:
        >>> isinstance(pure_python(), bool)
        True
    """
    return os.environ.get("REPLAYBANK_PURE_PYTHON", "") not in ("", "0")


def pick_kernel(prefer: str, module: str | None, attr: str | None, fallback: Any,
                caller: str, compiled: str | None = None) -> tuple[Any, str]:
    """Return ``(kernel, name)``: name ``"c"``, ``"numba"`` or ``"numpy"``.

    Args:
        prefer: ``"auto"`` (C, else numba, else numpy, whichever imports first), ``"c"``
            or ``"numba"`` (raise if that one cannot be imported) or ``"numpy"``.
        module: Module holding the numba kernels (imports numba), or None where there
            is no numba twin.
        attr: Name of the kernel in ``module`` (and in ``compiled``), or None for the
            module itself.
        fallback: The numpy implementation.
        caller: Name used in the error message.
        compiled: Module holding the C kernel (imports the built extension), if any.

    Raises:
        ValueError: ``prefer`` is not one of :data:`PREFERENCES`, or ``"c"`` for a
            kernel without a C twin.
        ImportError: ``prefer="c"`` or ``"numba"`` and that module cannot be imported.

    Example:
        >>> pick_kernel("auto", "replaybank.ops.sumtree_numba", "KERNELS", None, "k",
        ...             "replaybank.ops.sumtree_c")[1] in ("c", "numba", "numpy")
        True
        >>> pick_kernel("numpy", None, None, None, "k", "replaybank._lane")
        (None, 'numpy')
    """
    if prefer not in PREFERENCES:
        raise ValueError(f"{caller}(prefer={prefer!r}): use one of {list(PREFERENCES)}")
    if prefer == "c" and compiled is None:
        raise ValueError(f"{caller}(prefer='c'): this kernel has no C twin; use "
                         "'auto', 'numba' or 'numpy'")
    pure = pure_python()
    for name, source in (("c", compiled), ("numba", module)):
        if source is None or prefer not in ("auto", name):
            continue
        try:
            if name == "c" and pure:
                raise ImportError("REPLAYBANK_PURE_PYTHON is set: the C kernels are off")
            mod = importlib.import_module(source)
        except ImportError:
            if prefer == name:
                raise
        else:
            return (mod if attr is None else getattr(mod, attr)), name
    return fallback, "numpy"
