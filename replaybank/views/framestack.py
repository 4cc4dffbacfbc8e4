"""Frame stacks rebuilt at sample time from single stored frames.

The table stores one frame per step (e.g. ``uint8[84, 84]``); a sampled ``obs`` is the
stack ``[B, k, *frame]`` of the step's last ``k`` frames and ``next_obs`` the stack one
step later, exactly as gymnasium's ``FrameStackObservation(env, k,
padding_type="reset")`` gave them to the agent:

* at an episode start the first frame is repeated (``[o0, o0, o0, o0]``, then
  ``[o0, o0, o0, o1]``, ...),
* a stack never reaches into the previous episode (nor across a discontinuity), into
  another lane, or into overwritten data: steps whose history was overwritten are not
  served (:meth:`FrameStackView.valid`), and the sampler redraws them,
* the ``next_obs`` stack of a final step ends with the true final frame.

A step whose stack needs frames that were overwritten is not served. When a padded
stack's episode begins at the oldest stored step of its lane, the table can no longer
tell an episode start from lost history (the previous step is gone), so that step is
not served either (at most ``k - 1`` steps per lane, at the old end of the ring).
The steps before a lane's first step do not exist, so its first ``k - 1`` steps are
served, padded: in a fresh buffer, and after ``clear()`` alike, since the table records
where each lane began after its last clear (``StepTable.cleared``) and a history that
reaches back past it is padded as at an episode start. A cleared buffer then serves
exactly what a fresh buffer given the same adds serves.
Every obs field is stacked; views that rewrite observations (e.g. hindsight goal
relabelling) are not supported as ``inner``.

Inputs (:meth:`FrameStackView.prepare_inputs`): single frames ``(84, 84)`` or stacks
from ``FrameStackObservation`` ``(k, 84, 84)``; of a stack only the newest frame is
stored. With ``stacked_inputs=None`` the first add decides: an observation whose
per-step shape has at least 3 dims and starts with ``k`` is a stack (2-D stacks of
vectors need ``stacked_inputs=True``).

A buffer's ``spec=`` describes the values added (:meth:`FrameStackView.stored_spec`):
an obs leaf declared ``(k, *frame)`` that the first add would take as a stack (as
``rb.spec_from_env`` gives a ``FrameStackObservation`` env's space) is stored as
``frame``; with ``stacked_inputs=False`` a declared shape is the frame as it is. A
buffer's config records the spec of the values added, so a rebuilt buffer stores the
same frames.

Since only the newest frame of a stack is stored, the older frames of a stack given at
a lane's episode start (the lane's first step, also the first after ``clear()``, or a
step after an episode end; not a NEXT_STEP vector env's reset step, which goes from the
final frame to the reset frame) must be its first frame repeated, the stack this view rebuilds there
(``padding_type="reset"``, gymnasium's default): another padding (``padding_type=
"zero"``, SB3's ``VecFrameStack``) raises ``ConfigError`` and nothing is written
(:meth:`FrameStackView.prepare_lane_inputs`). This costs a compare of the table's
episode and clear counters per add; the table is read only while a lane is at an
episode start.
A stack given in mid-episode is not compared with the frames stored before it: that
would rebuild the newest step's stack at every add (measured: 9 us with one lane, 16
with four, where a stacked add takes about 10), so its older frames are taken to be the
ones stored.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=16, frame_stack=3, seed=0)
    >>> for t in range(4):
    ...     buf.add(obs=np.full((2, 2), t, np.uint8), action=0, reward=0.0,
    ...             next_obs=np.full((2, 2), t + 1, np.uint8), terminated=t == 3,
    ...             truncated=False)
    >>> buf.table.spec["obs"].shape          # one frame per step
    (2, 2)
    >>> b = buf.view.gather(buf.table, np.array([0, 3]))
    >>> b["obs"][:, :, 0, 0].tolist(), b["next_obs"][:, :, 0, 0].tolist()
    ([[0, 0, 0], [1, 2, 3]], [[0, 0, 1], [2, 3, 4]])
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError, ConfigError, ReplayBankError, describe
from replaybank.ops import windows
from replaybank.spec import SEP, FieldSpec, Spec, as_array, flatten, unflatten
from replaybank.storage.table import StepTable
from replaybank.views.base import LaneSpanView, ShiftedView, StepView, View, next_name
from replaybank.views.transition import TransitionView

__all__ = ["FrameStackView"]

IntArray = npt.NDArray[np.int64]
# (slots [B, k + 1], side [B], step [B], ok [B] or None, n_not_ok, n_side)
_Plan = tuple[IntArray, IntArray, IntArray, "npt.NDArray[np.bool_] | None", int, int]


class _Reads:
    """The arrays :meth:`FrameStackView.gather_valid` reads from one table: flat views
    of the non-obs fields, the obs frames and the kept-aside next frames."""

    __slots__ = ("arrays", "fields", "frames", "link", "next", "obs", "side", "table")

    def __init__(self, table: StepTable, frames: npt.NDArray[Any], obs: str) -> None:
        self.table = table
        self.link = table.link
        self.arrays = tuple(table.arrays.values())
        self.fields = [(name, table.flat(a)) for name, a in table.arrays.items()
                       if name != obs]
        self.obs = obs
        self.next = next_name(obs)
        self.frames = frames  # [T * lanes, *frame]
        self.side: Any = None

    def set_side(self, side: Any) -> bool:
        """Read the side store ``side`` (it is replaced when it grows); False when it is
        not a C-contiguous numpy array."""
        if type(side) is not np.ndarray or not side.flags.c_contiguous:
            return False
        self.side = side
        return True


def _counted(fn: Any) -> Any:
    """Wrap a ``stack_slots`` function into a ``stack_plan`` one: ``(slots, side, step,
    ok, n_not_ok, n_side)``."""
    def counted(link: Any, written: Any, counts: Any, cleared: Any, keys: IntArray, k: int,
                buffers: Any = None) -> tuple[
            IntArray, IntArray, IntArray, npt.NDArray[np.bool_], int, int]:
        slots, side, ok = fn(link, written, counts, cleared, keys, k)
        return slots, side, np.ascontiguousarray(slots[:, k - 1]), ok, \
            int(len(ok) - np.count_nonzero(ok)), int(np.count_nonzero(side >= 0))
    return counted


class _EpisodeStarts:
    """The check of the stacks given at a lane's episode start
    (:meth:`FrameStackView.prepare_lane_inputs`), and what it remembers of a table.

    A lane's step starts an episode when the lane holds no step (none yet, or none since
    its last ``clear()``: the view pads there as in a fresh buffer) or its newest stored
    step ended (terminated or truncated), unless the step's newest frame is that step's
    final frame (a NEXT_STEP reset step, which goes from the final observation to the
    reset one). Within an ``extend``, a step after an ended step of its lane starts one
    too. Each stack given at a start must be its newest frame repeated.

    The table is read only while a lane may be at an episode start: once no lane is, the
    table's per-lane episode and clear counters are remembered, and until one of them
    changes (an episode ended, or a clear) no lane can be at a start (a write of a step
    that ends nothing does not put its lane there). So a step costs one compare of those
    counters' bytes.
    """

    __slots__ = ("by_shape", "k", "memo")

    def __init__(self, k: int, by_shape: bool = False) -> None:
        self.k = k
        #: The view tells stacks from single frames by their shape (stacked_inputs=None)
        self.by_shape = by_shape
        #: (table, its episode and clear counters' bytes) when no lane of it was at a start
        self.memo: tuple[StepTable, bytes, bytes] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: what was read of a table is not kept."""
        return {"k": self.k, "by_shape": self.by_shape}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.k = state["k"]
        self.by_shape = bool(state.get("by_shape", False))
        self.memo = None

    def unchanged(self, table: StepTable) -> bool:
        """Whether no lane of ``table`` was at a start when its episode and clear
        counters were what they are now (so none is: the common step)."""
        memo = self.memo
        return memo is not None and memo[0] is table \
            and table.episodes.tobytes() == memo[1] and table.cleared.tobytes() == memo[2]

    def lanes_at_start(self, table: StepTable | None, lanes: IntArray) -> tuple[
            npt.NDArray[np.bool_], IntArray] | None:
        """``(start [m], kept [m])`` of the lanes ``lanes``: whether each one's next step
        starts an episode, and where that follows an ended step, the side slot of its
        final observation (-1 elsewhere); None when no lane of the table is at a start."""
        m = len(lanes)
        if table is None:  # the first write: every lane starts
            return np.ones(m, dtype=bool), np.full(m, -1, dtype=np.int64)
        episodes, cleared = table.episodes.tobytes(), table.cleared.tobytes()
        if self.unchanged(table):
            return None
        self.memo = None
        written = np.asarray(table.written)  # [L]
        every = np.arange(table.lanes, dtype=np.int64)
        rows = (written - 1) % table.T  # [L] each lane's newest row
        flags = [table.arrays["terminated"], table.arrays["truncated"]]  # [T, L] each
        if not table.plain_numpy:
            be = table.backend
            flags = [np.asarray(be.to_numpy(be.gather(f, (rows, every)))) for f in flags]
        else:
            flags = [f[rows, every] for f in flags]
        empty = np.asarray(table.counts) == 0  # [L] no step yet, or none since a clear
        ended = (flags[0] | flags[1]) & ~empty  # [L]
        start = empty | ended  # [L]
        if not start.any():
            self.memo = (table, episodes, cleared)
            return None
        kept = np.where(ended, np.asarray(table.link)[rows, every].astype(np.int64) - 1, -1)
        return start[lanes], kept[lanes]

    def check(self, stacks: dict[str, npt.NDArray[Any]], out: dict[str, Any],
              fields: dict[str, Any], steps: bool, lanes: IntArray, table: StepTable | None,
              layout: dict[str, tuple[bool, int]]) -> None:
        """Raise the error of :meth:`FrameStackView.prepare_lane_inputs` for a stack of
        ``stacks`` (each stacked ``obs`` leaf as given, by flat name) given at an episode
        start; ``out``: the prepared fields (their newest frames), ``fields``: the
        call's (its flags). A value whose leading dims are not the call's is left to the
        Python boundary, which names it."""
        at = self.lanes_at_start(table, lanes)
        if at is None and not steps:
            return  # no lane is at an episode start (the common step)
        m = len(lanes)
        flags = _ended(fields, m) if steps else None
        if at is None and (flags is None or not flags[:-1].any()):
            return  # no step of this call starts an episode
        flat_out = out if "obs" in stacks and len(stacks) == 1 else flatten(out)
        for name, arr in stacks.items():
            leaf = name.partition(SEP)[2]
            frame_ndim = layout[leaf][1]
            axis = arr.ndim - frame_ndim - 1  # the stack dim
            n = arr.shape[0] if steps and axis > 0 else 1
            if arr.dtype.kind not in "biuf" or arr.shape[axis] != self.k or n * m == 0 \
                    or int(np.prod(arr.shape[:axis])) != n * m:
                continue
            newest = np.asarray(flat_out[name]).reshape(n, m, -1)  # [n, m, frame items]
            start = np.zeros((n, m), dtype=bool)  # [n, m] steps that start an episode
            if at is not None:
                start[0] = at[0]
                _final_again(start[0], at[1], newest[0], table, name)
            nxt = flat_out.get("next_" + name)
            if flags is not None and n > 1 and len(flags) == n and nxt is not None \
                    and np.size(nxt) == newest.size:
                nxt = np.asarray(nxt).reshape(n, m, -1)
                start[1:] = flags[:-1] & ~_same(newest[1:], nxt[:-1])
            if not start.any():
                continue
            where = np.argwhere(start)  # [p, 2] (step, lane)
            given = np.ascontiguousarray(arr.reshape(n, m, self.k, -1)[start])  # [p, k, F]
            raw = given.view(np.uint8).reshape(len(given), self.k, -1)
            bad = np.flatnonzero(~(raw[:, :-1] == raw[:, -1:]).all(axis=(1, 2)))
            if len(bad):
                i, j = where[bad[0]].tolist()
                first = i == 0 and at is not None and at[1][j] < 0  # (no step in the lane)
                self._refuse(name, arr, arr.shape[axis:], steps, i, int(lanes[j]), first)

    def _refuse(self, name: str, arr: npt.NDArray[Any], stack: tuple[int, ...], steps: bool,
                step: int, lane: int, first: bool) -> None:
        """The error of a stack (per-step shape ``stack``) given at an episode start
        (``first``: the lane's first step) that is not its newest frame repeated."""
        k = self.k
        where = f"its step {step}" if steps else "it"
        why, also = (
            f"the first step of lane {lane}", "A lane's first step (also its first after "
            "clear()) starts an episode even where the env's began earlier: begin adding "
            "at an env reset") if first else (
            f"after an episode end in lane {lane}", "A step that continues an episode "
            "after another one's end (several envs' steps added to one lane) is taken as "
            "an episode start too: give each env its own lane (num_envs, env_ids)")
        if self.by_shape:  # a channels-first frame can look like a stack
            also += (
                f". Taken as a stack by its shape (at least 3 dims, the first {k}): if "
                f"each obs is one frame whose first dim happens to be {k} (a channels-first "
                f"image, e.g. (3, 84, 84) with frame_stack=3), pass "
                f"view=rb.FrameStackView({k}, stacked_inputs=False) in place of "
                f"frame_stack={k}")
        raise ConfigError(
            f"{'extend' if steps else 'add'}: {name}={describe(arr)}: {where} starts an "
            f"episode ({why}), but the older frames of its stack are not its first frame "
            f"repeated; frame_stack={k} stores the newest frame of each stack and rebuilds "
            "the stacks of an episode's first steps padded with its first frame, as "
            f'FrameStackObservation(env, {k}, padding_type="reset") gives them, so these '
            "stacks (another padding, e.g. padding_type=\"zero\") would be replayed "
            "otherwise than the agent saw them. Wrap the env with "
            f'FrameStackObservation(env, {k}, padding_type="reset"), or store the stacks as '
            f"they are: drop frame_stack (each step then stores its whole {stack} stack). "
            f"{also}")


def _ended(fields: dict[str, Any], m: int) -> npt.NDArray[np.bool_] | None:
    """``[n, m]``: which steps of an ``extend`` call's values end an episode, or None when
    its flags cannot be read as such (the Python boundary names them)."""
    try:
        ended: npt.NDArray[np.bool_] = np.asarray(as_array(fields["terminated"]), dtype=bool) \
            | np.asarray(as_array(fields["truncated"]), dtype=bool)
    except (KeyError, TypeError, ValueError, RuntimeError, ReplayBankError):
        return None
    if ended.ndim < 1 or ended.size != ended.shape[0] * m:
        return None
    return ended.reshape(ended.shape[0], m)


def _same(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """``[...]``: whether the rows ``a[..., :]`` and ``b[..., :]`` hold the same values
    (``b`` cast to ``a``'s dtype, as the boundary stores both)."""
    if a.dtype != b.dtype:
        b = b.astype(a.dtype)
    return np.asarray(((a == b) | ((a != a) & (b != b))).all(axis=-1), dtype=bool)


def _final_again(start: npt.NDArray[np.bool_], kept: IntArray, newest: npt.NDArray[Any],
                 table: StepTable | None, name: str) -> None:
    """Clear ``start`` ``[m]`` where a lane's newest frame ``newest`` ``[m, F]`` is the
    final frame its ended newest step kept aside (side slot ``kept``): a NEXT_STEP reset
    step, which is not an episode's first step."""
    pos = np.flatnonzero(start & (kept >= 0))
    if table is None or not len(pos) or name not in table.side.arrays:
        return
    be = table.backend
    final = np.asarray(be.to_numpy(be.gather(table.side.arrays[name], kept[pos])))
    start[pos[_same(final.reshape(len(pos), -1), newest[pos])]] = False


class FrameStackView:
    """Stacks ``k`` single stored frames of every obs field at sample time.

    Args:
        k: Frames per stack (>= 1).
        inner: The view whose transitions are stacked (default
            :class:`~replaybank.views.transition.TransitionView`); an inner view with
            ``last_keys(table, keys)`` (n-step) gets the next-obs stack of its last step.
        stacked_inputs: Whether added observations are stacks (keep the newest frame);
            None decides at the first add (see the module docs).
        kernel: ``"auto"`` (C where built, else numba when it imports, else numpy),
            ``"numba"`` or ``"numpy"``: who computes the stack slots (same results).

    Raises:
        ConfigError: ``k`` is not an int >= 1.

    Example:
        >>> FrameStackView(4).config()
        {'type': 'framestack', 'k': 4, 'inner': {'type': 'transition'}}
    """

    every_step = False

    def __init__(self, k: int, inner: View | None = None,
                 stacked_inputs: bool | None = None, kernel: str = "auto") -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ConfigError(f"FrameStackView(k={k!r}): k must be an int >= 1")
        if kernel not in ("auto", "numba", "numpy"):
            raise ConfigError(f"FrameStackView(kernel={kernel!r}): use 'auto', 'numba' or 'numpy'")
        if stacked_inputs is not None and not isinstance(stacked_inputs, bool):
            raise ConfigError(
                f"FrameStackView(stacked_inputs={stacked_inputs!r}): use True, False or None"
            )
        self.k = int(k)
        self.inner: View = inner if inner is not None else TransitionView()
        # what the inner view is, decided once: the plain one-step view (its fields are
        # taken directly) or one whose transitions end at another step (n-step)
        self._plain_inner = isinstance(self.inner, StepView)
        self._shifted = self.inner if isinstance(self.inner, ShiftedView) else None
        self.stacked_inputs = stacked_inputs
        # per obs leaf ("" for a plain obs): (is a stack, frame ndim), set at the first add
        self._layout: dict[str, tuple[bool, int]] = {}
        # which lanes' next step starts an episode (prepare_lane_inputs' check)
        self._starts = _EpisodeStarts(self.k, by_shape=stacked_inputs is None)
        self.kernel = kernel
        self._kernel: Any = None
        self._last: tuple[StepTable, IntArray, bytes, _Plan] | None = None
        # reused kernel output buffers (C or numba kernel; see windows.stack_buffers)
        self._buffers: Any = None
        # the row gather of every field of a batch (C, or numpy's take) and what it
        # reads (see _fast_reads)
        self._take: Any = None
        self._reads: _Reads | None = None

    # ------------------------------------------------------------------ inputs
    def _stacks(self, shape: tuple[int, ...]) -> bool:
        """Whether an observation leaf whose per-step shape is ``shape`` holds stacks,
        by ``stacked_inputs`` (None: at least 3 dims, the first ``k``)."""
        if self.stacked_inputs is None:
            return len(shape) >= 3 and shape[0] == self.k
        return self.stacked_inputs

    def _decide(self, leaf: str, arr: npt.NDArray[Any], n_lead: int, lanes: int) -> tuple[
            bool, int]:
        if leaf in self._layout:
            return self._layout[leaf]
        shape = arr.shape[n_lead:]
        if lanes == 1 and len(shape) >= 2 and shape[0] == 1 and shape[1] == self.k \
                and (self.stacked_inputs or len(shape) >= 4):
            shape = shape[1:]  # an explicit lane dim of 1
        stacked = self._stacks(shape)
        if stacked and (len(shape) < 1 or shape[0] != self.k):
            raise ConfigError(
                f"FrameStackView(k={self.k}, stacked_inputs=True): observation shape "
                f"{arr.shape} has no stack dim of size {self.k}; pass single frames with "
                "stacked_inputs=False or None"
            )
        layout = (stacked, len(shape) - 1 if stacked else len(shape))
        self._layout[leaf] = layout
        return layout

    def stored_spec(self, spec: Spec) -> Spec:
        """The fields stored for values added as ``spec`` describes them (a buffer's
        ``spec=``): an obs leaf shaped ``(k, *frame)`` that the first add would take as
        a stack (``FrameStackObservation``'s space, as ``rb.spec_from_env`` gives it) is
        stored as ``frame``, and this view takes that leaf's values as stacks from then
        on; every other field is stored as declared.

        Args:
            spec: The declared spec.

        Returns:
            The spec of the stored fields.

        Example:
            >>> v = FrameStackView(4)
            >>> v.stored_spec(Spec.coerce({"obs": ((4, 84, 84), "uint8")}))["obs"].shape
            (84, 84)
            >>> v.added_spec(Spec.coerce({"obs": ((84, 84), "uint8")}))["obs"].shape
            (4, 84, 84)
        """
        out = []
        for name, f in spec.items():
            top, _, leaf = name.partition(SEP)
            if top == "obs" and f.shape and f.shape[0] == self.k:
                layout = self._layout.get(leaf)
                if layout is None:
                    stacked = self._stacks(f.shape)
                    if stacked:  # decided now, as the first add would
                        self._layout[leaf] = (True, len(f.shape) - 1)
                else:
                    stacked = layout[0] and len(f.shape) == layout[1] + 1
                if stacked:
                    f = FieldSpec(name, f.shape[1:], f.dtype)
            out.append(f)
        return Spec(out)

    def added_spec(self, spec: Spec) -> Spec:
        """The spec of the values added for the stored fields ``spec`` (the inverse of
        :meth:`stored_spec`): an obs leaf whose values this view takes as stacks is
        ``(k, *frame)``.

        Args:
            spec: The stored fields (a table's spec).

        Returns:
            The spec a buffer's config records, which :meth:`stored_spec` maps back.
        """
        out = []
        for name, f in spec.items():
            top, _, leaf = name.partition(SEP)
            layout = self._layout.get(leaf) if top == "obs" else None
            if layout is not None and layout[0] and len(f.shape) == layout[1]:
                f = FieldSpec(name, (self.k, *f.shape), f.dtype)
            out.append(f)
        return Spec(out)

    def prepare_inputs(self, fields: dict[str, Any], steps: bool, lanes: int) -> dict[str, Any]:
        """Keep only the newest frame of stacked ``obs`` / ``next_obs`` values.

        Args:
            fields: The user's keyword fields (nested dicts allowed).
            steps: True for ``extend`` (leading step dim).
            lanes: Lanes written by this call.

        Returns:
            The fields with each stacked observation replaced by its newest frame.
        """
        decided = len(self._layout)
        try:
            return self._prepare(fields, steps, lanes, None)
        except BaseException:
            self._forget_layouts(decided)
            raise

    def prepare_lane_inputs(self, fields: dict[str, Any], steps: bool, lanes: IntArray,
                            table: StepTable | None) -> dict[str, Any]:
        """:meth:`prepare_inputs` of a call that writes the lanes ``lanes`` ``[m]`` of
        ``table`` (None before the first write), checking the stacks given at a lane's
        episode start: their older frames must be the first frame repeated, the stack
        this view rebuilds there (see the module docs).

        Args:
            fields: The user's keyword fields (nested dicts allowed).
            steps: True for ``extend`` (leading step dim).
            lanes: The lanes written ``[m]`` (the call's ``env_ids``, or every lane).
            table: The step table written, None before the first write (every lane is
                then at its first step).

        Returns:
            The fields with each stacked observation replaced by its newest frame.

        Raises:
            ConfigError: A stack given at an episode start is padded otherwise (e.g.
                ``FrameStackObservation(padding_type="zero")``), naming the fix; nothing
                is written.
        """
        stacks: dict[str, npt.NDArray[Any]] = {}
        decided = len(self._layout)  # leaves whose layout an earlier call decided
        try:
            out = self._prepare(fields, steps, len(lanes), stacks)
            # (single frames, or no lane at a start: the common add returns here)
            if stacks and (steps or table is None or not self._starts.unchanged(table)):
                self._starts.check(stacks, out, fields, steps, lanes, table, self._layout)
        except BaseException:
            self._forget_layouts(decided)  # a refused call changes nothing
            raise
        return out

    def _forget_layouts(self, decided: int) -> None:
        """Forget the input layouts decided after the first ``decided`` ones (a refused
        call's: the next call decides again from its own values).

        Args:
            decided: How many layouts to keep, in the order they were decided.
        """
        if len(self._layout) > decided:
            self._layout = dict(list(self._layout.items())[:decided])

    def _prepare(self, fields: dict[str, Any], steps: bool, lanes: int,
                 stacks: dict[str, npt.NDArray[Any]] | None) -> dict[str, Any]:
        """:meth:`prepare_inputs`; ``stacks`` (when given) gets each stacked ``obs`` leaf
        as it was given, by its flat name."""
        n_lead = int(steps) + int(lanes > 1)
        if not any(type(v) is dict or "/" in k for k, v in fields.items()):
            # flat fields (the usual call): only obs and next_obs change
            out = dict(fields)
            for name in ("obs", "next_obs"):
                if name in out:
                    out[name] = self._newest(out[name], name, "", n_lead, lanes, stacks)
            return out
        flat = flatten(fields)
        out = {}
        for name, value in flat.items():
            top, _, leaf = name.partition("/")
            if top not in ("obs", "next_obs"):
                out[name] = value
                continue
            out[name] = self._newest(value, name, leaf, n_lead, lanes, stacks)
        return unflatten(out)

    def _newest(self, value: Any, name: str, leaf: str, n_lead: int, lanes: int,
                stacks: dict[str, npt.NDArray[Any]] | None) -> npt.NDArray[Any]:
        """The newest frame of a stacked observation leaf (a C-contiguous copy), or the
        value as an array when it holds single frames (the boundary's conversion: a
        tuple is refused, :func:`~replaybank.spec.check_tuple`). A stacked ``obs`` leaf
        goes into ``stacks`` as given (when not None)."""
        arr = value if type(value) is np.ndarray else as_array(value, name)
        stacked, frame_ndim = self._decide(leaf, arr, n_lead, lanes)
        if stacked and arr.ndim >= frame_ndim + 1:
            if stacks is not None and name[0] == "o":  # obs, not next_obs
                stacks[name] = arr
            arr = arr.take(-1, axis=arr.ndim - frame_ndim - 1)
        return arr

    # ------------------------------------------------------------------ sampling
    def _pick_kernel(self) -> Any:
        """Choose the stack kernel once (C or numba: also its buffers) and the row gather."""
        fn, name = windows.kernel(windows.stack_slots, self.kernel)
        if name == "c":
            from replaybank.ops.windows_c import stack_plan
        elif name == "numba":
            from replaybank.ops.stack_numba import stack_plan
        if name != "numpy":
            self._kernel = stack_plan
            self._buffers = windows.stack_buffers(0, self.k)
        else:
            self._kernel = _counted(fn)
        self._take = windows.row_kernel("numpy" if self.kernel == "numpy" else "auto")[0]
        return self._kernel

    def _stack_slots(self, table: StepTable, keys: IntArray, reuse: bool = True) -> _Plan:
        """``(slots, side, step, ok, n_not_ok, n_side)`` of ``keys`` (see
        ``stack_numba.stack_plan``; ``ok`` may be None when ``n_not_ok == 0``).

        With ``reuse`` the arrays are views of this view's buffers, overwritten by the
        next reusing call: they never leave the view (gather copies out of them)."""
        kernel = self._kernel
        if kernel is None:
            kernel = self._pick_kernel()
        if not reuse or self._buffers is None:
            out: _Plan = kernel(table.link, table.written, table.counts, table.cleared, keys,
                                self.k)
            return out
        bufs = self._buffers
        if bufs[1].shape[0] != keys.shape[0]:
            bufs = self._buffers = windows.stack_buffers(keys.shape[0], self.k)
        out = kernel(table.link, table.written, table.counts, table.cleared, keys, self.k,
                     bufs)
        return out

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: what reads a table's arrays (a pickled view is a copy of them)
        is dropped and rebuilt on use, and so are the kernel's output buffers: they are
        views of one flat array, which pickling would copy apart (the kernel fills the
        flat array, so a copy's plan would be the views' stale contents)."""
        state = self.__dict__.copy()
        state["_last"] = None
        state["_reads"] = None
        if self._buffers is not None:
            state["_buffers"] = windows.stack_buffers(0, self.k)
        return state

    def valid(self, table: StepTable, keys: IntArray) -> npt.NDArray[np.bool_] | None:
        """Steps whose history (and the inner view's needs) is still stored (None: all)."""
        if type(keys) is not np.ndarray or keys.dtype != np.int64:
            keys = np.asarray(keys, dtype=np.int64)
        plan = self._stack_slots(table, keys)
        # one-shot cache: ReplayBuffer.sample gathers the same key array right after
        self._last = (table, keys, table.written.tobytes(), plan)
        inner_ok = None if self.inner.every_step else self.inner.valid(table, keys)
        ok = plan[3]
        if ok is None or plan[4] == 0:
            return inner_ok
        return ok if inner_ok is None else ok & inner_ok

    def _fast_reads(self, table: StepTable) -> _Reads | None:
        """What :meth:`gather_valid` reads, cached per table and rebuilt when one of its
        arrays is replaced; None unless one in-memory numpy obs field (the general path
        serves the rest)."""
        reads = self._reads
        arrays = table.arrays
        if reads is not None and reads.table is table and reads.link is table.link \
                and len(reads.arrays) == len(arrays) \
                and all(map(operator.is_, arrays.values(), reads.arrays)):
            return reads
        self._reads = None
        if not table.plain_numpy or len(table.obs_fields) != 1 \
                or not all(type(a) is np.ndarray for a in arrays.values()):
            return None
        obs = table.obs_fields[0]
        frames = table.flat(arrays[obs])
        if not frames.flags.c_contiguous:
            return None
        reads = _Reads(table, frames, obs)
        if not reads.set_side(table.side.arrays[obs]):
            return None
        self._reads = reads
        return reads

    def gather_valid(self, table: StepTable, keys: IntArray,
                     rng: np.random.Generator | None = None) -> dict[str, Any] | None:
        """:meth:`gather` of ``keys`` when the view can serve every one of them, else None.

        One pass instead of :meth:`valid` then :meth:`gather` (the sampling fast path):
        one kernel call decides whether every stack can be rebuilt and, when it can,
        copies the frames; when a key cannot be served nothing is gathered and the
        caller redraws it through :meth:`valid` (which gives the same answer).

        Args:
            table: The step table.
            keys: Item keys ``[B]``.

        Returns:
            The same fields as :meth:`gather`, or None when :meth:`valid` would reject a
            key.

        Example:
            >>> import replaybank as rb
            >>> buf = rb.ReplayBuffer(capacity=4, frame_stack=2, seed=0)
            >>> for t in range(6):
            ...     buf.add(obs=np.full(1, t), action=0, reward=0.0,
            ...             next_obs=np.full(1, t + 1), terminated=False, truncated=False)
            >>> buf.view.gather_valid(buf.table, np.array([2])) is None  # frame 1 is gone
            True
            >>> buf.view.gather_valid(buf.table, np.array([5]))["obs"][:, :, 0].tolist()
            [[4, 5]]
        """
        if not self._plain_inner:
            return None
        if type(keys) is not np.ndarray or keys.dtype != np.int64:
            keys = np.asarray(keys, dtype=np.int64)
        if self._kernel is None:
            self._pick_kernel()
        reads = self._fast_reads(table)
        if reads is not None:
            side = table.side.arrays[reads.obs]
            if side is not reads.side and not reads.set_side(side):
                reads = self._reads = None
        if reads is None:  # another backend or several obs fields
            plan = self._stack_slots(table, keys)
            if plan[4]:
                return None
            self._last = (table, keys, table.written.tobytes(), plan)
            return self.gather(table, keys)
        # [B, k + 1] slots, [B] side slots, [B] the steps' slots
        win, side, step, _, n_not_ok, n_side = self._stack_slots(table, keys)
        if n_not_ok:
            return None  # a key to redraw
        pos = None
        if n_side:
            pos = np.flatnonzero(side >= 0)
            kept = side[pos]
            if int(kept.max()) >= len(reads.side):
                return None  # a corrupt link, which gather then reports
        nb, k = keys.shape[0], self.k
        frames = reads.frames
        w = np.empty((nb, k + 1, *frames.shape[1:]), frames.dtype)  # [B, k + 1, *frame]
        out = {name: np.empty((nb, *a.shape[1:]), a.dtype) for name, a in reads.fields}
        # every field of the batch in one call: the windows' frames, the steps' rows
        self._take(((frames, win, w),
                    *((a, step, out[name]) for name, a in reads.fields)))
        if pos is not None:  # the next observation of a final step was kept aside
            w[pos, k] = reads.side[kept]
            moved = _relinked(table, step[pos], kept)
            if len(moved):  # (shared memory: see _relinked)
                w[pos[moved], k] = frames[(step[pos[moved]] + table.lanes) % len(frames)]
        out[reads.obs] = w[:, :-1]
        out[reads.next] = w[:, 1:]
        return out

    def _cached(self, table: StepTable, keys: IntArray) -> _Plan:
        last, self._last = self._last, None
        if last is not None and last[0] is table and last[1] is keys \
                and last[2] == table.written.tobytes():
            return last[3]
        return self._stack_slots(table, keys)

    def gather(self, table: StepTable, keys: IntArray,
               rng: np.random.Generator | None = None) -> dict[str, Any]:
        """Fields of ``keys`` with ``obs``/``next_obs`` as stacks ``[B, k, *frame]``."""
        if type(keys) is not np.ndarray or keys.dtype != np.int64:
            keys = np.asarray(keys, dtype=np.int64)
        k = self.k
        # [B, k + 1] slots, [B] side slots, [B] the steps' slots
        win, side, step, _, _, n_side = self._cached(table, keys)
        if self._plain_inner:
            out = table.take_fields(step, obs=False)
            same = True
        else:
            out = dict(self.inner.gather(table, keys, rng))
            if self._shifted is not None:
                last = np.asarray(self._shifted.last_keys(table, keys), np.int64)
                same = last is keys or np.array_equal(last, keys)
                if not same:  # n-step: obs stack of t, next stack of the window's last step
                    win_last, side, _, _, _, n_side = self._stack_slots(table, last,
                                                                        reuse=False)
                    win = np.concatenate([win[:, :k], win_last[:, 1:]], axis=1)  # [B, 2k]
            else:
                same = True
        be = table.backend
        numpy_be = table.plain_numpy
        pos = np.flatnonzero(side >= 0) if n_side else None
        stacks = []
        for name in table.obs_fields:
            frames = table.flat(table.arrays[name])
            # [B, n, *frame]; ndarray.take directly: the same as NumpyBackend.gather
            w = frames.take(win, axis=0) if numpy_be and type(frames) is np.ndarray \
                else be.gather(frames, win)
            if pos is not None:
                be.write(w, (pos, np.full(len(pos), win.shape[1] - 1)),
                         be.gather(table.side.arrays[name], side[pos]))
            stacks.append((frames, w))
            out[name] = w[:, :k]
            out[next_name(name)] = w[:, 1:] if same else w[:, k:]
        if pos is not None and numpy_be:  # (shared memory: see _relinked)
            owner = win[pos, -2]  # the step whose next observation was kept aside
            moved = _relinked(table, owner, side[pos])
            if len(moved):
                nxt = (owner[moved] + table.lanes) % (table.T * table.lanes)
                for frames, w in stacks:
                    w[pos[moved], -1] = frames[nxt]
        return out

    def state_dict(self) -> dict[str, Any]:
        """The input layout decided at the first add (``layout``: per observation leaf,
        ``[is a stack, frame ndim]``) and the inner view's state."""
        return {"layout": {leaf: [stacked, ndim] for leaf, (stacked, ndim)
                           in self._layout.items()},
                "inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`.

        Raises:
            CheckpointError: The state is not a frame-stack view's.
        """
        layout = state.get("layout", {})
        if not isinstance(layout, dict) or not all(
                isinstance(v, (list, tuple)) and len(v) == 2 for v in layout.values()):
            raise CheckpointError(f"FrameStackView state: layout={layout!r} is not "
                                  "{leaf: [stacked, ndim]}; the state is not a frame stack's")
        self._layout = {str(leaf): (bool(v[0]), int(v[1])) for leaf, v in layout.items()}
        self.inner.load_state_dict(state.get("inner", {}))

    def lane_spans(self) -> dict[str, int]:
        """A stack reads ``k`` frames of its lane, plus what the inner view reads
        (:class:`~replaybank.views.base.LaneSpanView`)."""
        inner = self.inner.lane_spans() if isinstance(self.inner, LaneSpanView) else {}
        return {**inner, "frame_stack": self.k}

    def config(self) -> dict[str, Any]:
        """JSON-able constructor arguments (with the inner view's config)."""
        cfg: dict[str, Any] = {"type": "framestack", "k": self.k, "inner": self.inner.config()}
        if self.stacked_inputs is not None:
            cfg["stacked_inputs"] = self.stacked_inputs
        if self.kernel != "auto":
            cfg["kernel"] = self.kernel
        return cfg

    def __repr__(self) -> str:
        return f"FrameStackView(k={self.k}, inner={type(self.inner).__name__})"


def _relinked(table: StepTable, owners: IntArray, kept: IntArray) -> IntArray:
    """Positions among ``owners`` (steps' slots, ``[m]``) whose link no longer names the
    side slot ``kept`` (``[m]``) it named when the plan was made.

    A table written by another process (shared memory) changes one kind of link while a
    learner reads: a writer relinks its previous newest step (``k -> 0``: its next
    observation is now the next row, committed first) and may reuse the freed slot at
    once. Read after the side rows were copied, such a step takes the next row instead
    (in one process links never change during a gather: always empty)."""
    now = table.flat(table.link)[owners]
    return np.flatnonzero(now != kept + 1)
