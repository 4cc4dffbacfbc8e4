"""Writers of the step table: the plan of a write (:mod:`.plan`), its reference applier
and the Python one-step writer (:mod:`.reference`), the compiled writer (:mod:`.compiled`),
the observation layouts it reads (:mod:`.layouts`), the kill-test hook (:mod:`.killpoint`)
and how a write tells the sampler (:mod:`.tell`). Which writer a buffer's call takes is
decided once per table by :class:`~replaybank.buffers.write_route.WriteRoute`."""
