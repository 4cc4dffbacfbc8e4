"""Memmap storage under failed opens, crashes, forks and bad paths: a failed call changes
nothing, a crash leaves a buffer that opens and keeps adding, and misuse is a clear error."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import CheckpointError, ConfigError


def _step(t: int, lanes: int) -> dict[str, np.ndarray]:
    return dict(obs=np.full((lanes, 3), t, np.float32), action=np.zeros(lanes, np.int64),
                reward=np.ones(lanes), next_obs=np.full((lanes, 3), t + 1, np.float32),
                terminated=np.zeros(lanes, bool), truncated=np.zeros(lanes, bool))


def _filled(path: Path, steps: int = 33, lanes: int = 2, capacity: int = 40) -> None:
    buf = rb.ReplayBuffer(capacity=capacity, num_envs=lanes, storage="memmap", path=path,
                          seed=1)
    for t in range(steps):
        buf.add(**_step(t, lanes))
    buf.close()


def _digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.iterdir()) if p.is_file()}


@pytest.mark.parametrize("override", [{"capacity": 20}, {"capacity": 60}, {"num_envs": 4}])
def test_open_refuses_a_file_shape_override_and_changes_nothing(
        tmp_path: Path, override: dict[str, int]) -> None:
    _filled(tmp_path)
    before = _digests(tmp_path)
    key, value = next(iter(override.items()))
    with pytest.raises(ConfigError, match=rf"{key}={value}.*{key}=\d+.*drop the {key}"):
        rb.open(tmp_path, **override)
    assert _digests(tmp_path) == before
    again = rb.open(tmp_path)
    assert len(again) == 40 and again.table.written.tolist() == [33, 33]
    again.add(**_step(33, 2))  # still writable


def test_a_failed_open_undoes_what_it_wrote(tmp_path: Path) -> None:
    _filled(tmp_path)
    counts = tmp_path / "meta%2Fcounts.bin"
    link = tmp_path / "meta%2Flink.bin"
    # a stale counts (a kill between a commit's two stores) the open repairs, and links
    # that no write leaves: the open fails after the repair and the owner record
    np.array([19, 19], "<i8").tofile(counts)
    lk = np.fromfile(link, "<i4").reshape(20, 2)
    lk[32 % 20, 0] = 0
    lk.tofile(link)
    before = _digests(tmp_path)
    with pytest.raises(CheckpointError, match="links are damaged"):
        rb.open(tmp_path, seed=7)
    assert _digests(tmp_path) == before
