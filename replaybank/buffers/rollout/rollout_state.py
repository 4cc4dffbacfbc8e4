"""Checkpoint packing of the rollout buffer: its arrays to a flat dict and back, checked.

Example:
    >>> import numpy as np
    >>> from replaybank.buffers.rollout.buffer import RolloutBuffer
    >>> buf = RolloutBuffer(2, num_envs=1)
    >>> buf.add(np.zeros(2), 0, 1.0, False, False, 0.0, 0.0)
    >>> parsed = unpack_state(buf.state_dict(), 2, 1, None, np.random.PCG64)
    >>> parsed.pos, sorted(parsed.fields)[:2]
    (1, ['action', 'log_prob'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.buffers.buffer_state import check_saved_sizes
from replaybank.buffers.rollout.autoreset import reset_mask
from replaybank.buffers.rollout.inputs import FinalObsStore
from replaybank.errors import CheckpointError, ReplayBankError
from replaybank.spec import Spec

__all__ = ["ParsedState", "pack_arrays", "unpack_state"]

AnyArray = npt.NDArray[Any]
_FINAL_OBS = "final_obs/"


def pack_arrays(data: dict[str, AnyArray], final_value: AnyArray, first_done: AnyArray,
                fobs: FinalObsStore | None, adv: AnyArray | None,
                ret: AnyArray | None, start_reset: AnyArray | None = None
                ) -> dict[str, AnyArray]:
    """Flat ``{name: array}`` of a rollout's contents, copies (a snapshot: later adds and
    computations do not change it, so it loads the rollout as it was).

    Keys: ``fields/<name>`` ``[T, E, *shape]``, ``final_value`` ``[T, E]`` (NaN where
    none), ``first_done`` ``[E]``, ``final_obs/index`` ``[k]`` and ``final_obs/<obs field>``
    ``[k, *shape]``, ``advantages``/``returns`` ``[pos, E]`` once computed, and with
    ``autoreset_mode="next_step"`` ``start_reset`` ``[E]`` (the env's last step before
    this rollout ended an episode, so its step 0 is a reset step).
    """
    arrays: dict[str, AnyArray] = {f"fields/{n}": a for n, a in data.items()}
    arrays["final_value"] = final_value
    arrays["first_done"] = first_done
    if start_reset is not None:
        arrays["start_reset"] = start_reset
    store = fobs.state() if fobs is not None else {"index": np.zeros(0, np.int64)}
    arrays.update({f"{_FINAL_OBS}{k}": v for k, v in store.items()})
    if adv is not None and ret is not None:
        arrays["advantages"], arrays["returns"] = adv, ret
    return {k: np.array(v, copy=True) for k, v in arrays.items()}


@dataclass
class ParsedState:
    """A validated rollout checkpoint (fresh copies, ready to install)."""

    spec: Spec | None
    fields: dict[str, AnyArray]
    pos: int
    final_value: AnyArray
    first_done: AnyArray
    fobs: FinalObsStore | None
    adv: AnyArray | None
    ret: AnyArray | None
    start_reset: AnyArray


def unpack_state(state: dict[str, Any], num_steps: int, num_envs: int,
                 current_spec: Spec | None, bit_generator: type[Any],
                 autoreset_mode: str | None = None) -> ParsedState:
    """Validate a rollout ``state_dict`` against the buffer's sizes and spec.

    Args:
        state: The state dict.
        num_steps: The buffer's ``num_steps``.
        num_envs: The buffer's ``num_envs``.
        current_spec: The buffer's spec (None if not yet known).
        bit_generator: The bit generator class of the buffer's rng (its state is probed).
        autoreset_mode: The buffer's ``autoreset_mode`` (None and ``"same_step"`` are
            the same; a state without the key was saved in that mode).

    Returns:
        The parsed contents (``start_reset`` all False unless ``"next_step"``).

    Raises:
        CheckpointError: Sizes, spec or autoreset mode differ, or arrays are missing or
            misshaped, or a NEXT_STEP reset step ends an episode.
    """
    meta, arrays = state.get("metadata"), state.get("arrays")
    if not isinstance(meta, dict) or not isinstance(arrays, dict) or "rng" not in state:
        raise CheckpointError("load_state_dict: the state lacks metadata, arrays or rng; pass "
                              "a RolloutBuffer.state_dict()")
    check_saved_sizes(meta, num_steps=num_steps, num_envs=num_envs)
    next_step = autoreset_mode == "next_step"
    saved_mode = meta.get("autoreset_mode")
    if (saved_mode == "next_step") != next_step:
        raise CheckpointError(
            f"load_state_dict: state has autoreset_mode={saved_mode!r} but this buffer has "
            f"autoreset_mode={autoreset_mode!r}; build the buffer with the saved "
            "autoreset_mode (it decides which stored steps are transitions)"
        )
    try:
        spec = None if meta.get("spec") is None else Spec.from_json(meta["spec"])
    except (ReplayBankError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"load_state_dict: the state's spec is not a valid spec ({exc}); "
                              "the state is damaged") from exc
    if current_spec is not None and spec is not None and spec != current_spec:
        raise CheckpointError(
            f"load_state_dict: state spec {spec} differs from the buffer's {current_spec}"
        )
    pos = meta.get("pos")
    if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)) \
            or not 0 <= pos <= num_steps:
        raise CheckpointError(f"load_state_dict: pos={pos} outside [0, {num_steps}]")
    try:
        fields = {n: np.array(arrays[f"fields/{n}"], dtype=f.dtype)
                  for n, f in (spec or Spec()).items()}
        for n, f in (spec or Spec()).items():
            if fields[n].shape != (num_steps, num_envs, *f.shape):
                raise ValueError(f"fields/{n} has shape {fields[n].shape}")
        fv = np.array(arrays["final_value"], dtype=np.float64).reshape(num_steps, num_envs)
        first = np.array(arrays["first_done"], dtype=bool).reshape(num_envs)
        start = np.zeros(num_envs, dtype=bool)
        if next_step:
            start = np.array(arrays["start_reset"], dtype=bool).reshape(num_envs)
            _check_resets(fields, start, int(pos))
        bit_generator().state = state["rng"]  # probe: a bad rng state fails here
        fobs = None if spec is None else FinalObsStore(spec)
        if fobs is not None:
            fobs.load({k[len(_FINAL_OBS):]: v for k, v in arrays.items()
                       if k.startswith(_FINAL_OBS)})
            idx = np.asarray(fobs.index, dtype=np.int64)
            if np.any((idx < 0) | (idx >= pos * num_envs)) or len(np.unique(idx)) < len(idx):
                raise ValueError(f"final_obs/index {idx.tolist()} must be distinct steps in "
                                 f"[0, pos * num_envs = {pos * num_envs})")
        adv = None if arrays.get("advantages") is None else np.array(arrays["advantages"])
        ret = None if arrays.get("returns") is None else np.array(arrays["returns"])
        for name, arr in (("advantages", adv), ("returns", ret)):
            if arr is not None and arr.shape != (pos, num_envs):
                raise ValueError(f"{name} has shape {arr.shape}, expected {(pos, num_envs)}")
    except (KeyError, ValueError, TypeError, IndexError, OverflowError) as exc:
        raise CheckpointError(f"load_state_dict: missing or misshaped array ({exc})") from exc
    return ParsedState(spec, fields, int(pos), fv, first, fobs, adv, ret, start)


def _check_resets(fields: dict[str, AnyArray], start: AnyArray, pos: int) -> None:
    """Raise a ValueError when a NEXT_STEP reset step of the state ends an episode (an
    add never stores one)."""
    if "terminated" not in fields or not pos:
        return
    done = fields["terminated"][:pos] | fields["truncated"][:pos]  # [pos, E]
    bad = reset_mask(done, start) & done
    if bad.any():
        t, e = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"fields/terminated|truncated is True at step {t}, env {e}, a NEXT_STEP reset "
            "step (start_reset or the step before ended an episode); reset steps never end "
            "one, the state is damaged"
        )
