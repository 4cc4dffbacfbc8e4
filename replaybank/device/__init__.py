"""The device room: replay whose arrays are torch tensors on a device (``storage="torch"``).

Everything about the device path lives here, above the CPU core, which imports none of it
(an import contract says so): the package registers ``storage="torch"`` and the features
the core calls (:mod:`replaybank.registry`). Modules:

* :mod:`~replaybank.device.backend`: the step table's arrays as preallocated tensors;
* :mod:`~replaybank.device.store`: the device :class:`~replaybank.buffers.store.Store`;
* :mod:`~replaybank.device.path`: one-step samples drawn on the host (numpy storage's
  keys) and gathered on the device; ``sample_fn``'s CUDA graph;
* :mod:`~replaybank.device.draws`: uniform draws on the device (``sample_fn``);
* :mod:`~replaybank.device.mirror`: host bookkeeping mirrored on the device (``sample_fn``);
* :mod:`~replaybank.device.hindsight`: hindsight relabelling with torch ops;
* :mod:`~replaybank.device.prefetch`: batches sampled ahead and moved to a device.

torch is imported when a device buffer or prefetcher is built (the ``torch`` extra),
never when this room is imported.

Example:
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(16, storage="torch", device="cpu")
    >>> type(buf.store).__module__
    'replaybank.device.store'
"""
