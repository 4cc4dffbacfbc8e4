"""Torch tensors to host numpy arrays: the one conversion every boundary uses.

A value a user hands replaybank (an observation, a reward, a priority, what a
``value_fn`` returns) may be a torch tensor on any device, requiring grad or not, or a
conjugate/negative view. :func:`tensor_to_numpy` turns each into a host numpy array of the
same shape: a plain CPU tensor is viewed without a copy (``Tensor.numpy()``), every other
one is detached, copied to the host and has its lazy conjugate/negation resolved; a
bfloat16 tensor (numpy has no bfloat16) becomes float32, which holds every bfloat16 value
exactly. :func:`as_numpy` does that for tensors and ``np.asarray`` for everything else.

torch is never imported here: a value can only be a tensor when torch is already loaded,
so :func:`is_tensor` looks it up in ``sys.modules`` (the core imports no torch).

Example:
    >>> import torch
    >>> t = torch.tensor([1.0, 2.0], requires_grad=True)
    >>> is_tensor(t), is_tensor([1.0, 2.0])
    (True, False)
    >>> tensor_to_numpy(t * 2).tolist()
    [2.0, 4.0]
    >>> as_numpy([1, 2]).dtype.name, as_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype.name
    ('int64', 'float32')
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import DtypeError, ShapeError, describe

__all__ = ["as_numpy", "is_tensor", "tensor_to_numpy"]


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (checked without importing torch).

    Args:
        value: Anything.

    Returns:
        True for a ``torch.Tensor`` (any device, any dtype, a ``Parameter`` too); False
        for everything else, and always False while torch is not imported.

    Example:
        >>> import numpy as np, torch
        >>> is_tensor(torch.zeros(2)), is_tensor(np.zeros(2)), is_tensor(None)
        (True, False, False)
    """
    if not hasattr(value, "detach"):  # every tensor has it: a cheap "no" for plain values
        return False
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def tensor_to_numpy(value: Any, arg: str | None = None) -> npt.NDArray[Any]:
    """A torch tensor as a host numpy array of the same shape.

    Args:
        value: A torch tensor ``[*shape]`` on any device, requiring grad or not, possibly
            a conjugate or negative view.
        arg: The argument it came as, named in the error (None: the value alone).

    Returns:
        ``[*shape]``: a view without a copy for a plain CPU tensor (no grad, no lazy
        conjugate/negation, a dtype numpy has); otherwise a detached host copy with the
        conjugate/negation resolved. bfloat16 (no numpy dtype) becomes float32 (exact).

    Raises:
        TypeError: ``value`` is not a torch tensor.
        DtypeError: The tensor holds no data a host array can show (a meta tensor, a
            sparse layout, a dtype numpy lacks such as float8), naming ``arg`` and the fix.

    Example:
        >>> import torch
        >>> t = torch.arange(3.0)
        >>> a = tensor_to_numpy(t); a[0] = 7.0; t.tolist()  # a view: no copy
        [7.0, 1.0, 2.0]
        >>> tensor_to_numpy(torch.tensor([1 + 2j]).conj()).tolist()
        [(1-2j)]
        >>> tensor_to_numpy([1.0])
        Traceback (most recent call last):
        ...
        TypeError: tensor_to_numpy([1.0]): expected a torch tensor; use as_numpy for any value
        >>> tensor_to_numpy(torch.zeros(2, device="meta"), "obs")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        replaybank.errors.DtypeError: obs=Tensor(...): a torch tensor numpy cannot show (...); ...
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        raise TypeError(f"tensor_to_numpy({describe(value)}): expected a torch tensor; use "
                        "as_numpy for any value")
    try:
        return value.numpy()  # type: ignore[no-any-return]  # plain CPU tensor: a view
    except (RuntimeError, TypeError):  # grad, another device, conj/neg view, bfloat16
        pass
    try:
        t = value.detach()
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)
        return t.cpu().resolve_conj().resolve_neg().numpy()  # type: ignore[no-any-return]
    except (RuntimeError, TypeError, NotImplementedError) as exc:  # meta, sparse, float8
        shown = describe(value) if arg is None else f"{arg}={describe(value)}"
        raise DtypeError(
            f"{shown}: a torch tensor numpy cannot show ({exc}); pass a dense tensor that "
            "holds values (e.g. tensor.to_dense(), or real data instead of a meta tensor) "
            "of a dtype numpy has") from exc


def as_numpy(value: Any, arg: str | None = None, *,
             label: str | Callable[[], str] | None = None, expected: str | None = None,
             fix: str | None = None) -> npt.NDArray[Any]:
    """``value`` as a numpy array: :func:`tensor_to_numpy` for a torch tensor, else
    ``np.asarray(value)`` (arrays as they are, lists and scalars converted).

    This is the one ragged check of replaybank: a nest whose rows have different lengths
    (``[[1.0, 2.0], [3.0]]``, a list of unlike arrays), which numpy refuses with a bare
    ``ValueError``, is a :class:`~replaybank.errors.ShapeError` naming the argument and
    its value, the first row whose shape differs, the shape expected and the fix. Every
    boundary converts through it (the add boundary through
    :func:`replaybank.spec.as_array`; priorities, keys, TD errors and masks through
    :func:`replaybank.spec.rows_array`, with their own ``expected`` and ``fix``).

    Args:
        value: A torch tensor, numpy array, list, scalar, ...
        arg: The argument it came as (``"obs"``, ``"obs['a']"``), named in the errors.
        label: The start of the ragged error instead of ``arg=<value>``: the call,
            argument and value (``"update_priorities(priorities=[[1.0], [1.0, 2.0]])"``),
            or a function that returns it (called only for the message).
        expected: The shape wanted, in words, for the ragged error (None: one array).
        fix: What to pass instead, for the ragged error (None: an array with rows of one
            length, or a dict of arrays for a structured value).

    Returns:
        A numpy array of ``value``'s shape.

    Raises:
        DtypeError: A tensor numpy cannot show (:func:`tensor_to_numpy`).
        ShapeError: A ragged nest.
        TypeError: What numpy raises for a value it cannot convert at all (left to the
            caller's dtype check).

    Example:
        >>> import torch
        >>> as_numpy(torch.ones(2, requires_grad=True)).tolist(), as_numpy(3.0).shape
        ([1.0, 1.0], ())
        >>> as_numpy([np.zeros(2), np.zeros(1)], "obs")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        replaybank.errors.ShapeError: obs=[array([0., 0.]), array([0.])]: a ragged nest, rows of different lengths ([1] has shape (1,) but [0] has shape (2,)); expected one array ...
        >>> as_numpy([[1.0], [2.0, 3.0]], label="f(x=...)", expected="[B, 2]",
        ...          fix="pad the short rows")
        Traceback (most recent call last):
        ...
        replaybank.errors.ShapeError: f(x=...): a ragged nest, rows of different lengths ([1] has shape (2,) but [0] has shape (1,)); expected [B, 2]: pad the short rows
    """  # noqa: E501
    if is_tensor(value):
        return tensor_to_numpy(value, arg)
    try:
        return np.asarray(value)
    except ValueError as exc:  # ragged: numpy cannot make one array of it
        if label is None:
            said = describe(value) if arg is None else f"{arg}={describe(value)}"
        else:
            said = label if isinstance(label, str) else label()
        where = _first_unlike(value) or str(exc)
        if fix is None:
            parts = "value[0], '1': value[1]" if arg is None else f"{arg}[0], '1': {arg}[1]"
            fix = ("pass an array whose rows have one length (values of several envs or "
                   "steps all of one shape), or a dict of arrays for a structured value "
                   f"({{'0': {parts}, ...}}, as rb.collect stores a gymnasium Tuple space)")
        raise ShapeError(
            f"{said}: a ragged nest, rows of different lengths ({where}); expected "
            f"{expected or 'one array (at every depth, rows of one length)'}: {fix}"
        ) from exc


def _first_unlike(value: Any) -> str | None:
    """Where a ragged nest is ragged: ``"[1] has shape (1,) but [0] has shape (2,)"`` for
    the first row (depth first) whose shape differs from its first sibling's, or None
    where every row has its sibling's shape (numpy refused it for another reason)."""
    try:
        _outline(value, "")
    except _UnlikeRowError as found:
        return str(found)
    return None


class _UnlikeRowError(Exception):
    """A row of a nest whose shape differs from its first sibling's (its message)."""


def _outline(value: Any, at: str) -> tuple[int, ...]:
    """The shape ``np.asarray(value)`` would have (lists and tuples walked, arrays and
    tensors by their shape, anything else a scalar), or :class:`_UnlikeRowError` naming the first
    row, by its index path from the top (``at``), whose shape differs from its first
    sibling's."""
    if isinstance(value, np.ndarray) or is_tensor(value):
        return tuple(value.shape)
    if not isinstance(value, (list, tuple)):
        return ()
    first: tuple[int, ...] | None = None
    for i, item in enumerate(value):
        shape = _outline(item, f"{at}[{i}]")
        if first is None:
            first = shape
        elif shape != first:
            raise _UnlikeRowError(f"{at}[{i}] has shape {shape} but {at}[0] has shape {first}")
    return (len(value), *(first or ()))
