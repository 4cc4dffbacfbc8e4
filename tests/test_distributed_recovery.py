"""A shard killed with SIGKILL: Ray restarts it from the latest checkpoint, clients keep
sampling from the other shards meanwhile and report the degraded state, and writes to
the dead shard are sent again, not dropped (real local Ray; slow)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest

from tests.distributed_ray import SHARD_CPUS, steps

ray = pytest.importorskip("ray")
from replaybank.distributed import ReplayService  # noqa: E402


@pytest.mark.slow
def test_killed_shard_restarts_from_its_checkpoint(ray_cluster: Any, tmp_path: Any
                                                   ) -> None:
    cfg = {"capacity": 64, "sampler": {"type": "prioritized"}}
    svc = ReplayService(2, cfg, num_lanes=2, checkpoint_dir=tmp_path / "ck", max_restarts=2,
                        num_cpus=SHARD_CPUS, timeout=30.0, seed=0)
    try:
        c = svc.client(max_rows=1)
        c.extend(**steps(2, 0, 10))
        c.flush()
        saved = svc.checkpoint()
        c.extend(**steps(2, 10, 14))  # after the checkpoint: lost with shard 0's process
        c.flush()
        assert [s["size"] for s in svc.stats()["shards"]] == [14, 14]
        pid = svc.shard_pids()[0]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        first = c.sample(32)  # shard 0 is found dead: shard 1 serves the whole batch
        assert set((first.obs[:, 0] // 1000).astype(int).tolist()) == {1}
        assert c.shard_failures == {0: 1}
        deadline = time.monotonic() + 60
        while c.degraded_shards:  # reported until Ray has restarted it
            assert c.degraded_shards == {0}
            b = c.sample(32)
            assert set((b.obs[:, 0] // 1000).astype(int).tolist()) == {1}
            assert time.monotonic() < deadline, "shard 0 never came back"
            time.sleep(0.02)
        b = c.sample(256)
        assert set((b.obs[:, 0] // 1000).astype(int).tolist()) == {0, 1}
        st = svc.stats()
        assert st["degraded_shards"] == []
        assert st["shards"][0]["restored_from"] == str(saved)
        assert st["shards"][0]["pid"] != pid
        assert [s["size"] for s in st["shards"]] == [10, 14]
        # writes meet a restarted shard: nothing dropped
        c.extend(**steps(2, 14, 16))
        c.flush()
        assert [s["size"] for s in svc.stats()["shards"]] == [12, 16]
    finally:
        svc.shutdown()


@pytest.mark.slow
def test_writes_to_a_dead_shard_are_sent_again(ray_cluster: Any, tmp_path: Any
                                               ) -> None:
    svc = ReplayService(2, {"capacity": 64}, num_lanes=2, checkpoint_dir=tmp_path / "ck",
                        max_restarts=2, num_cpus=SHARD_CPUS, timeout=30.0)
    try:
        c = svc.client(max_rows=1, max_in_flight=2)
        c.extend(**steps(2, 0, 4))
        c.flush()
        svc.checkpoint()
        pid = svc.shard_pids()[0]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for t in range(4, 12):  # sent while shard 0 is dead or restarting
            c.extend(**steps(2, t, t + 1))
        c.flush()
        sizes = [s["size"] for s in svc.stats()["shards"]]
        assert sizes == [12, 12]
        b = c.sample(64)
        ids = np.sort(np.unique(b.obs[:, 0].astype(int)))
        assert set(ids.tolist()) <= set(range(12)) | set(range(1000, 1012))
    finally:
        svc.shutdown()


@pytest.mark.slow
def test_clear_with_a_shard_down_names_it_and_changes_nothing(ray_cluster: Any) -> None:
    """``clear()`` cannot skip a shard that is down, as sampling does (its rows would be
    sampled again once it is back): it waits for it as a write does, and when it does
    not come back within ``timeout`` raises ShardUnavailableError naming it, with no
    shard cleared and the client's queued rows kept."""
    from replaybank.distributed import ShardUnavailableError

    svc = ReplayService(2, {"capacity": 64}, num_lanes=2, max_restarts=0,
                        num_cpus=SHARD_CPUS, timeout=30.0)
    try:
        c = svc.client(timeout=1.0, max_age_s=1e3)
        c.extend(**steps(2, 0, 6))
        c.flush()
        c.extend(**steps(2, 6, 8))  # queued
        pid = svc.shard_pids()[0]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ShardUnavailableError, match=r"clear: shards \[0\] are down"):
            c.clear()
        assert c.pending_rows == 4
        assert [None if s is None else s["size"] for s in svc.stats()["shards"]] == [None, 6]
    finally:
        svc.shutdown()
