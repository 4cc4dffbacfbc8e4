"""Choosing between a numba-compiled kernel and its numpy oracle.

Every compiled kernel in replaybank has a pure-numpy twin with the same signature and
results (the tests check both). :func:`pick_kernel` returns the compiled one when numba
imports, unless the caller asks for numpy.

Example:
    >>> import numpy as np
    >>> pick_kernel("numpy", "replaybank.ops.stack_numba", "stack_slots", np.sum, "k")[1]
    'numpy'
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PREFERENCES", "pick_kernel"]

PREFERENCES = ("auto", "numba", "numpy")


def pick_kernel(prefer: str, module: str, attr: str, fallback: Any, caller: str) -> tuple[Any, str]:
    """Return ``(kernel, "numba")`` from ``module.attr`` or ``(fallback, "numpy")``.

    Args:
        prefer: ``"auto"`` (numba when it imports), ``"numba"`` (raise if it cannot be
            imported) or ``"numpy"``.
        module: Module holding the compiled kernels (imports numba).
        attr: Name of the compiled kernel in ``module``.
        fallback: The numpy implementation.
        caller: Name used in the error message.

    Raises:
        ValueError: ``prefer`` is not one of :data:`PREFERENCES`.
        ImportError: ``prefer="numba"`` and numba is not installed.
    """
    if prefer not in PREFERENCES:
        raise ValueError(f"{caller}(prefer={prefer!r}): use one of {list(PREFERENCES)}")
    if prefer != "numpy":
        try:
            mod = importlib.import_module(module)
        except ImportError:
            if prefer == "numba":
                raise
        else:
            return getattr(mod, attr), "numba"
    return fallback, "numpy"
