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


def as_numpy(value: Any, arg: str | None = None) -> npt.NDArray[Any]:
    """``value`` as a numpy array: :func:`tensor_to_numpy` for a torch tensor, else
    ``np.asarray(value)`` (arrays as they are, lists and scalars converted).

    Args:
        value: A torch tensor, numpy array, list, scalar, ...
        arg: The argument it came as, for :func:`tensor_to_numpy`'s error.

    Returns:
        A numpy array of ``value``'s shape.

    Raises:
        DtypeError: A tensor numpy cannot show (:func:`tensor_to_numpy`).
        ShapeError: A ragged nest, such as a tuple of unlike arrays (a gymnasium Tuple
            space's value), naming ``arg`` and the dict to pass instead.

    Example:
        >>> import torch
        >>> as_numpy(torch.ones(2, requires_grad=True)).tolist(), as_numpy(3.0).shape
        ([1.0, 1.0], ())
        >>> as_numpy((np.zeros(2), 1), "obs")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        replaybank.errors.ShapeError: obs=(...): a ragged nest ...
    """
    if is_tensor(value):
        return tensor_to_numpy(value, arg)
    try:
        return np.asarray(value)
    except ValueError as exc:  # ragged: numpy cannot make one array of it
        shown = describe(value) if arg is None else f"{arg}={describe(value)}"
        raise ShapeError(
            f"{shown}: a ragged nest numpy cannot make one array of ({exc}); pass an array, "
            "or a dict of arrays for a structured value (a gymnasium Tuple space's value "
            "as {'0': value[0], '1': value[1], ...}, as rb.collect stores it)") from exc
