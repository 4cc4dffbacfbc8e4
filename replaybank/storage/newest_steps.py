"""Each lane's newest step as the writer needs it, kept in host memory (device storage).

When a write arrives, the writer asks whether each lane's previous newest step continues
into the first new observation: the step did not end its episode, and its kept-aside
next observation equals the new observation bitwise (see
:mod:`replaybank.storage.writers.reference`). For storage in host memory both are read
from the arrays. For device storage (torch tensors on a GPU) that read is a device-to-host
copy and a synchronisation on every write, so such a table keeps, per lane, the done flag
and the next observation of the newest step here, on the host, as they were written.
It is small (``lanes`` observations) and is rebuilt from the table's saved state on load.

Example:
    >>> import numpy as np
    >>> from replaybank.spec import Spec
    >>> spec = Spec.coerce({"obs": ((2,), "float32")})
    >>> tail = NewestSteps(spec, ["obs"], lanes=3)
    >>> tail.record(np.array([2, 0]), np.array([True, False]),
    ...             {"obs": np.array([[1, 2], [3, 4]], np.float32)})
    >>> tail.done[[0, 2]].tolist(), tail.next_obs["obs"][0].tolist()
    ([False, True], [3.0, 4.0])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.spec import Spec

__all__ = ["NewestSteps"]


class NewestSteps:
    """Per lane: the done flag and next observation of the newest step, in host numpy.

    Args:
        spec: The table's fields (the observation fields' shapes and dtypes are used).
        obs_fields: Names of the observation fields.
        lanes: Number of lanes.

    Attributes:
        done: ``terminated | truncated`` of each lane's newest step, ``[lanes]``.
        next_obs: ``{obs field: [lanes, *shape]}``, each lane's newest next observation.
    """

    def __init__(self, spec: Spec, obs_fields: Sequence[str], lanes: int) -> None:
        self.done: npt.NDArray[np.bool_] = np.zeros(lanes, dtype=bool)
        self.next_obs: dict[str, npt.NDArray[Any]] = {
            name: np.zeros((lanes, *spec[name].shape), dtype=spec[name].dtype)
            for name in obs_fields
        }

    def record(self, lanes: npt.NDArray[np.int64], done: npt.NDArray[np.bool_],
               next_obs: Mapping[str, npt.NDArray[Any]]) -> None:
        """The newest steps of ``lanes`` ``[m]`` are now: ``done`` ``[m]`` and
        ``next_obs`` ``{name: [m, *shape]}`` (host arrays, as written)."""
        self.done[lanes] = done
        for name, arr in self.next_obs.items():
            arr[lanes] = next_obs[name]

    def load(self, T: int, arrays: Mapping[str, Any]) -> None:  # noqa: N803
        """Rebuild from a checked table state (:mod:`replaybank.storage.table_state`
        keys: ``meta/written``, ``meta/counts``, ``meta/link``, ``fields/terminated``,
        ``fields/truncated``, ``side/<obs field>``); lanes with no live step are zeroed."""
        written = np.asarray(arrays["meta/written"], dtype=np.int64)
        counts = np.asarray(arrays["meta/counts"], dtype=np.int64)
        self.done[:] = False
        for arr in self.next_obs.values():
            arr[...] = 0
        for lane in np.flatnonzero(counts > 0).tolist():
            row = int((written[lane] - 1) % T)

            def at(key: str, r: int = row, ln: int = lane) -> Any:
                return np.asarray(arrays[key][r:r + 1])[0, ln]

            self.done[lane] = bool(at("fields/terminated")) or bool(at("fields/truncated"))
            slot = int(at("meta/link")) - 1
            if slot >= 0:  # a newest step always keeps its next observation aside
                for name, arr in self.next_obs.items():
                    arr[lane] = np.asarray(arrays[f"side/{name}"][slot:slot + 1])[0]
