"""The client's write batching (no Ray): one flat buffer per send, limits, order."""

from __future__ import annotations

import numpy as np

from replaybank.distributed.writer import RowBatcher, unpack


def rows(t: int, lanes: int, t0: int = 0) -> dict[str, object]:
    step = np.arange(t0, t0 + t)[:, None] + 100 * np.arange(lanes)[None, :]
    return {"obs": {"x": np.stack([step, -step], -1).astype(np.float32),
                    "mask": (step % 2 == 0)},
            "reward": step.astype(np.float64)}


def test_payloads_keep_order_nesting_priorities_and_limits() -> None:
    # 4 lanes over 2 shards; 3 lanes' worth of bytes per step and shard: 20 steps
    b = RowBatcher(num_shards=2, max_rows=1000, max_age_s=60.0,
                   max_bytes=20 * 2 * (8 + 1 + 8 + 8))
    sent: dict[int, list[dict[str, object]]] = {0: [], 1: []}
    for t0 in range(0, 50, 7):  # calls of 7 steps: groups split across calls
        data = rows(7, 4, t0)
        ready = b.append(data, np.arange(4), np.full((7, 4), t0, float), steps=True)
        for s in ready:
            while (p := b.take(s)) is not None:
                sent[s].append(p)
    for s in b.close_all():
        while (p := b.take(s)) is not None:
            sent[s].append(p)
    assert b.pending_rows == 0
    for s in (0, 1):
        assert [p["steps"] for p in sent[s]] == [20, 20, 16]  # full groups, then the rest
        parts = [unpack(p) for p in sent[s]]
        x = np.concatenate([v["obs"]["x"] for v, _ in parts])
        want = rows(56, 4)
        np.testing.assert_array_equal(x, want["obs"]["x"][:, s::2])  # type: ignore[index]
        mask = np.concatenate([v["obs"]["mask"] for v, _ in parts])
        assert mask.dtype == bool and bool(np.all(mask == (x[..., 0] % 2 == 0)))
        pr = np.concatenate([p for _, p in parts])
        assert pr.shape == (56, 2) and pr[0, 0] == 0 and pr[-1, 0] == 49
        assert all(p["env_ids"] == [0, 1] for p in sent[s])


def test_a_change_of_lanes_or_dtype_closes_the_group_and_rows_are_copied() -> None:
    b = RowBatcher(num_shards=1, max_rows=100, max_age_s=60.0)
    data = rows(3, 2)
    b.append(data, np.arange(2), None, steps=True)
    data["reward"][:] = -1.0  # type: ignore[index]  # the caller reuses its arrays
    b.append(rows(2, 1, 3), np.array([1]), None, steps=True)  # other lanes: closes
    wide = rows(1, 1, 5)
    wide["reward"] = np.zeros((1, 1), np.float32)  # other dtype: closes
    b.append(wide, np.array([1]), None, steps=True)
    b.close_all()
    out = [b.take(0) for _ in range(3)]
    assert b.take(0) is None
    first, _ = unpack(out[0])  # type: ignore[arg-type]
    assert first["reward"][:, 1].tolist() == [100.0, 101.0, 102.0]
    assert [p["env_ids"] for p in out] == [[0, 1], [1], [1]]  # type: ignore[index]
    assert unpack(out[2])[0]["reward"].dtype == np.float32  # type: ignore[arg-type]
