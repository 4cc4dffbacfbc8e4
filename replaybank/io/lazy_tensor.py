"""Arrays of a checkpoint's state file, read on demand instead of all at once.

A buffer restored from a checkpoint copies its table data (``fields/...`` and
``side/...`` arrays) in chunks of rows, straight from the file; :class:`LazyTensor`
stands for such an array until then, and :func:`lazy_tensors` gives every tensor of a
checked manifest as a lazy one (table data) or as a numpy array (everything else).

Example:
    >>> import tempfile, numpy as np
    >>> from replaybank.io.checkpoint import save_state
    >>> from replaybank.io.manifest import open_checked
    >>> d = tempfile.mkdtemp()
    >>> _ = save_state({"w": np.arange(6.0).reshape(3, 2)}, d)
    >>> manifest, sf = open_checked(d, "buffer_")
    >>> with sf:
    ...     w = LazyTensor(sf, "w", np.dtype(np.float64), (3, 2))
    ...     len(w), w[1:3].tolist()
    (3, [[2.0, 3.0], [4.0, 5.0]])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.io.safetensors_stream import StateFile
from replaybank.io.state_tree import walk_markers

__all__ = ["LazyTensor", "lazy_tensors"]


class LazyTensor:
    """An array in a state file, read on demand (rows ``[i:j]`` at a time).

    Supports ``shape``, ``dtype``, ``ndim``, ``len()``, slicing along axis 0 and
    ``numpy.asarray`` (reads everything).
    """

    def __init__(self, sf: StateFile, name: str, dtype: np.dtype[Any],
                 shape: tuple[int, ...]) -> None:
        self._sf, self.name, self.dtype, self.shape = sf, name, dtype, shape
        self.ndim = len(shape)
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def _read(self, lo: int, hi: int) -> npt.NDArray[Any]:
        out = np.empty((hi - lo, *self.shape[1:]), dtype=self.dtype)
        row = out[0].nbytes if len(out) else 0
        if out.nbytes:
            self._sf.read_into(self.name, lo * row, out)
        return out

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice) and self.ndim and key.step in (None, 1):
            lo, hi, _ = key.indices(self.shape[0])
            return self._read(lo, max(lo, hi))
        return np.asarray(self)[key]

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[Any]:
        if self.ndim == 0:
            out = np.empty((), dtype=self.dtype)
            self._sf.read_into(self.name, 0, out)
        else:
            out = self._read(0, self.shape[0])
        return out if dtype is None else out.astype(dtype)


def lazy_tensors(manifest: dict[str, Any], sf: StateFile) -> dict[str, Any]:
    """Lazy tensors for table data (copied in chunks), arrays for everything else.

    Args:
        manifest: A manifest checked by :func:`~replaybank.io.manifest.check_tensors`
            (its tensor entries carry the parsed ``_dtype`` and ``_shape``).
        sf: The open state file.

    Returns:
        ``{tensor name: LazyTensor or numpy array}``.
    """
    lazy_names = {name for path, name in walk_markers(manifest["state"])
                  if len(path) >= 2 and path[-2] == "table"
                  and path[-1].startswith(("fields/", "side/"))}
    out: dict[str, Any] = {}
    for name, t in manifest["tensors"].items():
        lt = LazyTensor(sf, name, t["_dtype"], t["_shape"])
        out[name] = lt if name in lazy_names else np.asarray(lt)
    return out
