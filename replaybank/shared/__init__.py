"""The shared-memory room: collector processes write their own lanes, one learner samples.

``buf = rb.ReplayBuffer(capacity, num_envs, spec=..., storage="shared")`` is the owner
and learner: it creates the shared-memory arrays (:mod:`replaybank.shared.backend`) and
samples them like any buffer (uniform, PER, n-step, sequences, frame stacks, HER: every
sampler and view). It does not write: each collector process gets a picklable handle,
``buf.writer(lanes)``, and calls its ``open()`` to get a
:class:`~replaybank.shared.writer.SharedWriter` whose ``add`` / ``extend`` write its lanes
(values ``[len(lanes), ...]``, as for ``num_envs=len(lanes)``). A writer owns its lanes
(a second writer of the same lane is refused while the first one is open and its process
lives, in that process too), so writes need no lock. Initial priorities (Ape-X:
``add(..., priority=td)``) go through a shared array and reach the learner's PER sampler
with the step.

The learner samples a consistent snapshot of what the writers committed
(:mod:`replaybank.shared.lanes`): never a step before it is complete, never a step being
overwritten. Before each sample it refreshes the snapshot and tells its sampler which
steps entered and left; after the gather it checks that no writer overwrote what it read
(else it draws again). Left out of each lane's window: the ``guard`` oldest steps of a full
lane (:func:`~replaybank.shared.lanes.default_guard`) and the newest step while
its next observation has not arrived.

``rb.save(buf, d)`` writes one snapshot, copied (:mod:`replaybank.shared.checkpoint`):
exactly the steps the learner samples from at that moment, with its sampler state and
generator. ``rb.load(d)`` rebuilds it in memory (``storage="numpy"``); it draws what the
learner would have drawn next.

A writer process killed mid-``add`` (even with SIGKILL) leaves its lanes consistent: the
learner sees the steps committed before, and a new writer may take the lanes over
(``buf.writer(lanes).open()`` again). When the owner closes, is collected or exits, the
segments are unlinked; after a SIGKILL of the owner its resource tracker, or else the
next owner started on the machine, removes them.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(64, num_envs=2, seed=0, storage="shared",
    ...                       spec={"obs": ((3,), "float32"), "action": ((), "int64")})
    >>> w = buf.writer(lanes=[0, 1]).open()  # normally in a collector process
    >>> for t in range(5):
    ...     w.add(obs=np.full((2, 3), t, np.float32), action=np.array([t, t]),
    ...           reward=np.ones(2, np.float32), next_obs=np.full((2, 3), t + 1, np.float32),
    ...           terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
    >>> len(buf)  # the newest step of each lane waits for its next observation
    8
    >>> batch = buf.sample(4)
    >>> bool(np.all(batch.next_obs == batch.obs + 1))
    True
    >>> w.close(); buf.close()

Modules: :mod:`~replaybank.shared.backend` (the segments), :mod:`~replaybank.shared.lanes`
and :mod:`~replaybank.shared.snapshot` (what the learner may read),
:mod:`~replaybank.shared.reader` (the learner's refresh and retry),
:mod:`~replaybank.shared.checkpoint` (the snapshot as a saved table),
:mod:`~replaybank.shared.writer` (a collector's handle and writer) and
:mod:`~replaybank.shared.store` (the owner's :class:`~replaybank.buffers.store.Store`).
Nothing in the core imports this room; the package registers ``storage="shared"``
(:func:`replaybank.registry.register_storage`).
"""
