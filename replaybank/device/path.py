"""Sampling for device storage: keys drawn on the host, one packed copy, one gather per dtype group.

A buffer with ``storage="torch"`` keeps its field data in device tensors (packed per dtype:
:meth:`~replaybank.device.backend.TorchBackend.allocate_fields`) and its
bookkeeping on the host. :class:`DevicePath` serves its one-step ``sample``:

1. the buffer's sampler draws the keys on the host, with the buffer's numpy generator,
   exactly as for numpy storage (the calls of :meth:`Parts.sample
   <replaybank.buffers.sampling_parts.Parts.sample>`: the same keys, and for a
   :class:`~replaybank.samplers.prioritized.PrioritizedSampler` the same probabilities
   and weights, under the same seed), so the batch is numpy storage's, key for key and
   field for field, as device tensors;
2. the host computes the ``[2B]`` slots of the steps and of their next steps, and, from
   its own links, which next observations are kept aside (episode ends, discontinuities,
   each lane's newest step) and in which side slots;
3. all of it reaches the device in one packed copy (:func:`~replaybank.transfer.to_device`;
   on the CPU the host arrays are wrapped, no copy), each dtype group is read with one
   ``index_select``, each field handed out as a view of its columns, and the next
   observations kept aside are patched from the side store (two launches per
   observation field, only when there are any).

On a GPU every torch op is a kernel launch that costs the host 10 to 18 us
(``docs/benchmarks.md``), so the call is held to those few launches: one copy and one
gather per dtype group, two more when a next observation is aside. Drawing on the device
took 11 launches (21 before that), and a device sum tree 73 for PER. Nothing reads a
device value on the host (no ``.item()``, ``.cpu()``, ``nonzero`` or boolean indexing of a
device tensor), so a sample queues its work and returns.

Which calls take it (else the host path serves the call, unchanged): a sampler with
exactly uniform draws (:class:`~replaybank.samplers.base.UniformDraws`: the default
``UniformSampler``) without options, or a plain proportional ``PrioritizedSampler``
(``beta=`` allowed), with a one-step view (:class:`~replaybank.views.base.StepView`) and
``replace=True``. Everything else (n-step, frame stacks, recent, lane split, sequences,
``replace=False``) draws on the host as numpy storage does and gathers on the device.

:meth:`DevicePath.sample_fn` is the fixed-batch path: its draw and gather are captured
once as a CUDA graph and replayed, so nothing host-side may enter a launch. It draws with
a ``torch.Generator`` of its own from the device mirror of the bookkeeping
(:class:`~replaybank.device.mirror.DeviceMirror`, :func:`~replaybank.device.draws.
uniform_keys`; the same distribution as the host draw, not the same keys) and looks up
the kept next observations in the mirror's links. That generator is seeded from the
buffer's numpy generator on first use, and its state is saved with the buffer
(``state_dict()["device_rng"]``).

Example:
    >>> import numpy as np, replaybank as rb
    >>> buf = rb.ReplayBuffer(64, num_envs=2, storage="torch", device="cpu", seed=0)
    >>> for t in range(10):
    ...     buf.add(obs=np.full((2, 3), t, np.float32), action=[0, 1], reward=[1.0, 0.0],
    ...             next_obs=np.full((2, 3), t + 1, np.float32), terminated=[False, False],
    ...             truncated=[False, False])
    >>> b = buf.sample(8)
    >>> type(b.indices).__name__, bool((b.next_obs == b.obs + 1).all())
    ('Tensor', True)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from replaybank.buffers.sampling_parts import Parts
from replaybank.device.draws import uniform_keys
from replaybank.device.mirror import DeviceMirror
from replaybank.ops import ring
from replaybank.samplers.base import LaneView
from replaybank.samplers.prioritized import PrioritizedSampler
from replaybank.samplers.sample_args import LARGE_BATCH
from replaybank.storage.table import StepTable
from replaybank.transfer import to_device
from replaybank.views.base import next_name

__all__ = ["DeviceArrays", "DevicePath", "device_path"]


@runtime_checkable
class DeviceArrays(Protocol):
    """A backend whose arrays are torch tensors on ``device`` and which takes the device
    path (``device_draws``: this module's sample, and ``sample_fn``'s draws on the device;
    False: the local store's host path, no ``sample_fn``)."""

    device: Any
    device_draws: bool
    host_numpy: bool


def device_path(backend: Any) -> DevicePath | None:
    """The device path of a buffer on ``backend`` (None: not device storage, or the
    device path turned off: ``TorchBackend(draws="host")``)."""
    if isinstance(backend, DeviceArrays) and backend.device_draws and not backend.host_numpy:
        return DevicePath(backend.device)
    return None


@dataclass
class _Group:
    """Fields sharing one tensor: its flat ``[T * lanes, width]`` view and each member's
    ``(name, columns, field shape, next name)``: its column (a scalar field) or slice of
    columns, and ``next_<name>`` for an observation field (else None)."""

    flat: Any
    members: list[tuple[str, int | slice, tuple[int, ...], str | None]] = field(
        default_factory=list)
    has_obs: bool = False


class DevicePath:
    """Host draws and grouped device gathers for one buffer, and :meth:`sample_fn`'s
    device draws (see the module docs).

    Args:
        device: The storage's ``torch.device``.

    Attributes:
        packed: Send a host draw in one packed copy (:func:`~replaybank.transfer.
            to_device`); False on the CPU, where the host arrays are wrapped as they are.
    """

    def __init__(self, device: Any) -> None:
        self.torch = sys.modules["torch"]  # device storage imported it
        self.device = device
        self.packed = device.type != "cpu"
        self.generator: Any = None  # seeded from the host generator on first use
        self._mirror: DeviceMirror | None = None
        # (table, its arrays, their dtype groups, the batch's keys in the host path's order)
        self._plan: tuple[StepTable, tuple[Any, ...], list[_Group], dict[str, Any]] | None = None
        self._static: dict[int, _Static] = {}
        # (lanes, [[0], [lanes]] on the device): the offsets of a slot and of its next step
        self._next_offsets: tuple[int, Any] | None = None

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """``{"generator": uint8 state}`` once seeded, else ``{}``."""
        if self.generator is None:
            return {}
        return {"generator": self.generator.get_state().numpy().copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (``{}``: reseed from the host generator on next use)."""
        gen = state.get("generator")
        if gen is None:
            self.generator = None
            return
        g = self.torch.Generator(device=self.device)
        g.set_state(self.torch.from_numpy(np.ascontiguousarray(gen, dtype=np.uint8)))
        self.generator = g

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: the generator as its state; plans and graphs are rebuilt."""
        return {"device": str(self.device), "state": self.state_dict()}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        self.__init__(sys.modules["torch"].device(saved["device"]))  # type: ignore[misc]
        self.load_state_dict(saved["state"])

    # ------------------------------------------------------------------ sampling
    def serves(self, parts: Parts, replace: Any, kwargs: dict[str, Any]) -> bool:
        """Whether :meth:`sample` serves this call (host draw, device gather; see the
        module docs)."""
        if replace is not True or parts.step is None or parts.transform is not None:
            return False
        if parts.traits.uniform is not None:
            return not kwargs
        return self._prioritized(parts) is not None and set(kwargs) <= {"beta"}

    def serves_static(self, parts: Parts) -> bool:
        """Whether :meth:`sample_fn` serves these parts (uniform one-step draws)."""
        return parts.traits.uniform is not None and self.serves(parts, True, {})

    @staticmethod
    def _prioritized(parts: Parts) -> PrioritizedSampler | None:
        """The buffer's sampler when it is a plain proportional PER sampler."""
        sampler = parts.traits.sampler
        return sampler if isinstance(sampler, PrioritizedSampler) else None

    def sample(self, table: StepTable | None, parts: Parts, rng: np.random.Generator,
               batch_size: Any, replace: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """A batch drawn on the host and gathered on the device, or None: the host path
        serves this call (another sampler or view, options, or arguments the host path
        rejects with its errors: a bad batch size, an empty buffer, a zero total
        priority)."""
        if table is None or type(batch_size) is not int or not 0 < batch_size <= LARGE_BATCH \
                or not self.serves(parts, replace, kwargs) or table.size == 0:
            return None
        per = self._prioritized(parts)
        if per is not None and not per.total > 0.0:  # the host path raises its error
            return None
        return self._host_draw_gather(table, parts, rng, batch_size, kwargs)

    def _host_draw_gather(self, table: StepTable, parts: Parts, rng: np.random.Generator,
                          batch_size: int, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Keys drawn by the buffer's sampler on the host (the host path's draw:
        :meth:`Parts.sample <replaybank.buffers.sampling_parts.Parts.sample>`'s calls,
        the same generator, so the same keys, probabilities and weights), sent with the
        ``[2B]`` slots of the steps and their next steps, and the batch positions and
        side slots of the next observations kept aside (read from the host's links), in
        one packed copy, then gathered: one copy and one ``index_select`` per dtype group
        when no next observation is aside, two launches more per observation field when
        one is. One route, two draws: uniform and prioritized."""
        uniform = parts.traits.uniform
        weights = probabilities = None
        if uniform is not None and table.lanes == 1 and not kwargs:
            # the host path's one-lane shortcut (Parts._sample): the same keys
            keys = uniform.one_lane_keys(batch_size, table.written, table.counts, rng)
        else:
            lanes = LaneView(table.T, table.lanes, table.written, table.counts)
            res = parts.traits.sampler.sample(batch_size, lanes, rng, replace=True, **kwargs)
            keys, weights, probabilities = res.keys, res.weights, res.probabilities
        n = table.T * table.lanes
        slots = ring.key_to_slot(keys, table.T, table.lanes)
        lk = table.link.reshape(-1)[slots]  # [B] side slot + 1, or 0
        pos = lk.nonzero()[0]
        host: dict[str, Any] = {"pairs": np.concatenate([slots, (slots + table.lanes) % n]),
                                "indices": keys}
        if len(pos):
            host["aside_pos"] = pos.astype(np.int64)
            host["aside_slots"] = lk[pos].astype(np.int64) - 1
        if weights is not None:
            host["weights"] = weights.astype(np.float32)
        if probabilities is not None:
            host["probabilities"] = probabilities
        dev: dict[str, Any] | None = None
        if self.packed:  # one packed copy (on the CPU: the arrays themselves)
            dev = to_device(self.torch, host, self.device, pin=self.device.type == "cuda")
        if dev is None:
            dev = {k: self.torch.from_numpy(v).to(self.device) for k, v in host.items()}
        aside = (dev.pop("aside_pos"), dev.pop("aside_slots")) if len(pos) else ()
        out = self.gather(table, dev.pop("pairs"), aside)
        out.update(dev)
        return out

    def _seed(self, rng: np.random.Generator) -> None:
        if self.generator is None:
            self.generator = self.torch.Generator(device=self.device)
            self.generator.manual_seed(int(rng.integers(0, 2**63 - 1)))

    def _draw_gather(self, table: StepTable, rng: np.random.Generator,
                     batch_size: int) -> dict[str, Any]:
        """Draw ``batch_size`` keys from the device counters alone
        (:func:`uniform_keys`) and gather them, with no host value in any launch: the
        body of :meth:`sample_fn`'s CUDA graph (its caller syncs the mirror outside the
        capture)."""
        mirror = self.mirror(table)
        self._seed(rng)
        keys, slots = uniform_keys(self.torch, self.generator, mirror.written,
                                   mirror.counts, table.T, batch_size)
        out = self.gather(table, self._pairs(table, slots))
        out["indices"] = keys
        return out

    def _pairs(self, table: StepTable, keys: Any) -> Any:
        """``[2B]`` slots: those of ``keys`` ``[B]`` (item keys or slots), then the slots
        of their next steps: two kernels."""
        lanes = table.lanes
        held = self._next_offsets
        if held is None or held[0] != lanes:
            held = self._next_offsets = (lanes, self.torch.tensor(
                [[0], [lanes]], dtype=self.torch.int64, device=self.device))
        return ((keys.unsqueeze(0) + held[1]) % (table.T * lanes)).view(-1)

    def mirror(self, table: StepTable) -> DeviceMirror:
        """The device mirror of ``table``'s bookkeeping (made on first use)."""
        m = self._mirror
        if m is None or m.link.shape[0] != table.T * table.lanes:
            m = self._mirror = DeviceMirror(self.torch, self.device, table)
        return m

    def _groups(self, table: StepTable) -> tuple[list[_Group], dict[str, Any]]:
        """The dtype groups of ``table``'s fields and the keys of a gather in the host
        path's order (:meth:`StepTable.gather_transitions
        <replaybank.storage.table.StepTable.gather_transitions>`: every field in spec
        order, then the next observations), as a dict of None to copy: a batch's keys do
        not depend on the storage (rebuilt when an array is replaced)."""
        arrays = tuple(table.arrays.values())
        plan = self._plan
        if plan is not None and plan[0] is table and len(plan[1]) == len(arrays) \
                and all(a is b for a, b in zip(plan[1], arrays, strict=True)):
            return plan[2], plan[3]
        by_base: dict[int, _Group] = {}
        n = table.T * table.lanes
        for name, arr in table.arrays.items():
            base = arr if arr._base is None else arr._base  # packed: views of one tensor
            g = by_base.get(id(base))
            if g is None:
                g = by_base[id(base)] = _Group(base.reshape(n, -1))
            shape = tuple(arr.shape[2:])
            width = int(np.prod(shape, dtype=np.int64))
            col = arr.storage_offset() - base.storage_offset()
            obs = name in table.obs_fields
            g.members.append((name, col if not shape else slice(col, col + width), shape,
                              next_name(name) if obs else None))
            g.has_obs |= obs
        groups = list(by_base.values())
        order = dict.fromkeys([*table.arrays, *map(next_name, table.obs_fields)])
        self._plan = (table, arrays, groups, order)
        return groups, order

    def gather(self, table: StepTable, pairs: Any, aside: Any = None) -> dict[str, Any]:
        """Every stored field ``[B, *shape]`` and ``next_<obs field>`` of the device slots
        ``pairs[:B]`` (``pairs``: ``[2B]``, the slots then their next steps' slots, see
        :meth:`_pairs`): one ``index_select`` per dtype group, views per field.

        Args:
            table: The step table.
            pairs: ``[2B]`` int64 device slots.
            aside: Which next observations come from the side store: None, read from the
                mirror's links on the device (four launches, and a ``where`` per
                observation field); ``()``, none; ``(pos [k], side_slots [k])`` device
                tensors from the host's links, the batch positions and their side slots
                (two launches per observation field).
        """
        torch = self.torch
        B = int(pairs.shape[0]) // 2  # noqa: N806
        slots = pairs[:B]
        lookup = aside is None
        if lookup:
            lk = self.mirror(table).link.index_select(0, slots)  # [B] side slot + 1 or 0
            kept_aside = lk > 0
            side_slot = (lk - 1).clamp_(min=0)
        groups, order = self._groups(table)
        out: dict[str, Any] = dict(order)  # filled below, its keys in the host's order
        # each view made in one indexing call (on a GPU machine a view op costs the host
        # microseconds too): columns of the first B rows; the next B rows for next obs
        for g in groups:
            rows = g.flat.index_select(0, pairs if g.has_obs else slots)  # [2B or B, width]
            head = slice(0, B) if g.has_obs else slice(None)
            for name, cols, shape, nxt in g.members:
                v = rows[head, cols]
                out[name] = v.view(B, *shape) if len(shape) > 1 else v
                if nxt is None:
                    continue
                nx = rows[B:, cols]
                if len(shape) > 1:
                    nx = nx.view(B, *shape)
                side = table.side.arrays[name]
                if lookup:
                    kept = side.index_select(0, side_slot)  # [B, *shape]
                    nx = torch.where(kept_aside.view(B, *([1] * len(shape))), kept, nx)
                elif aside:
                    nx.index_copy_(0, aside[0], side.index_select(0, aside[1]))
                out[nxt] = nx
        return out

    # ------------------------------------------------------------------ fixed batches
    def sample_fn(self, table: StepTable, rng: np.random.Generator,
                  batch_size: int) -> dict[str, Any]:
        """Draw and gather ``batch_size`` into static tensors (the same tensors every call
        for this batch size) and return them. On CUDA the draw and gather are captured
        once as a CUDA graph and replayed (recaptured when the side store grows); on
        other devices they run eagerly and are copied into the static tensors."""
        self.mirror(table).sync(table)  # host-to-device copies: never inside a capture
        st = self._static.get(batch_size)
        if st is None or not st.fits(table):  # new, or recaptured into the same outputs
            st = self._static[batch_size] = _Static(self, table, rng, batch_size,
                                                    None if st is None else st.out)
        st.run()
        return st.out


class _Static:
    """One fixed batch size of :meth:`DevicePath.sample_fn`: static output tensors and,
    on CUDA, the graph that fills them."""

    def __init__(self, path: DevicePath, table: StepTable, rng: np.random.Generator,
                 batch_size: int, out: dict[str, Any] | None = None) -> None:
        self.path, self.table, self.rng, self.batch_size = path, table, rng, batch_size
        self.side = tuple(table.side.arrays.values())
        if out is None:
            first = path._draw_gather(table, rng, batch_size)
            out = {k: v.clone() for k, v in first.items()}
        self.out = out
        self.graph: Any = None
        torch = path.torch
        if path.device.type == "cuda":  # pragma: no cover - needs a GPU
            stream = torch.cuda.Stream(device=path.device)
            stream.wait_stream(torch.cuda.current_stream(path.device))
            with torch.cuda.stream(stream):
                self._fill()  # warm up outside the graph
            torch.cuda.current_stream(path.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            graph.register_generator_state(path.generator)
            with torch.cuda.graph(graph):
                self._fill()
            self.graph = graph

    def fits(self, table: StepTable) -> bool:
        """The captured tensors are still the table's (the side store may have grown)."""
        return table is self.table and all(
            a is b for a, b in zip(self.side, table.side.arrays.values(), strict=True))

    def _fill(self) -> None:
        got = self.path._draw_gather(self.table, self.rng, self.batch_size)
        for k, v in got.items():
            self.out[k].copy_(v)

    def run(self) -> None:
        if self.graph is None:
            self._fill()
        else:  # pragma: no cover - needs a GPU
            self.graph.replay()
