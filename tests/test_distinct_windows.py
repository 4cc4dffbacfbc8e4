"""One buffer's ``sample_sequences(B, L, replace=False)``: distinct windows.

The starts are drawn from the servable ones (usable, of positive priority) by successive
sampling: a uniformly random subset (uniform sampler), each next start in proportion to
priority among those not drawn yet (prioritized). Checked against the exact servable set
(a plain loop over the steps), the hypergeometric law and a Gumbel top-k simulation; a
batch above the servable starts is refused before anything is drawn.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.buffers.sequences import servable_windows
from replaybank.errors import ConfigError, EmptyBufferError
from tests.stats import chi2_critical, hypergeometric_cells, successive_inclusion

L = 3  # window length
#: stored priority == raw priority (so a priority of 0 is never drawn)
PLAIN = {"type": "prioritized", "alpha": 1.0, "eps": 0.0, "beta": 0.4, "kernel": "numpy"}


def episodes() -> dict[str, Any]:
    """30 steps of 2 lanes: lane 0 ends an episode every 3 steps, lane 1 never;
    ``obs[..., 0]`` is the step id ``1000 * lane + t`` (also the sharded service's data
    in tests/test_distributed_windows.py: lane ``i`` on shard ``i``)."""
    t = np.arange(30)[:, None] + np.zeros((1, 2))
    lane = np.arange(2)[None, :] + np.zeros((30, 1))
    oid = (1000 * lane + t).astype(np.float32)
    term = np.zeros((30, 2), bool)
    term[:, 0] = np.arange(30) % 3 == 2
    return {"obs": np.stack([oid, oid], -1), "action": np.zeros((30, 2), np.int64),
            "reward": np.ones((30, 2), np.float32),
            "next_obs": np.stack([oid + 1, oid + 1], -1), "terminated": term,
            "truncated": np.zeros((30, 2), bool)}


def usable(i: int) -> bool:
    """Whether step id ``i`` starts a full window of ``L`` steps inside its episode (a
    plain loop's answer: lane 0's episodes are steps 3k..3k+2)."""
    lane, t = divmod(i, 1000)
    return t % 3 == 0 if lane == 0 else t <= 30 - L


def buffer(sampler: Any, prio: np.ndarray | None = None) -> Any:
    cfg: dict[str, Any] = {"capacity": 64, "seed": 0, "num_envs": 2}
    if sampler is not None:
        cfg["sampler"] = sampler
    buf = rb.from_config(cfg)
    buf.extend(**episodes(), **({} if prio is None else {"priority": prio}))
    return buf


def starts(batch: Any) -> list[int]:
    return batch.obs[:, 0, 0].astype(np.int64).tolist()


def zero_early_lane1() -> np.ndarray:
    """Priorities 0.5..4 with steps 0..4 of lane 1 at 0: never drawn, not servable."""
    prio = np.random.default_rng(2).uniform(0.5, 4.0, (30, 2))
    prio[:5, 1] = 0.0
    return prio


@pytest.mark.parametrize("sampler", [None, PLAIN], ids=["uniform", "per"])
def test_distinct_windows_are_servable_starts_and_all_of_them_fit(sampler: Any) -> None:
    prio = None if sampler is None else zero_early_lane1()
    buf = buffer(sampler, prio)
    servable = {i for lane in range(2) for t in range(30)
                if usable(i := 1000 * lane + t) and (prio is None or prio[t, lane] > 0)}
    assert len(servable) == (38 if sampler is None else 33)
    mass = len(servable) if prio is None else sum(prio[i % 1000, i // 1000] for i in servable)
    assert servable_windows(buf.table, buf.lane_view(), buf.sampler_traits, L) == \
        (len(servable), pytest.approx(mass, rel=1e-12))
    for b in (1, 7, len(servable) - 1):
        for _ in range(20):
            got = starts(buf.sample_sequences(b, L, replace=False))
            assert len(set(got)) == b and set(got) <= servable
    every = buf.sample_sequences(len(servable), L, replace=False)
    assert set(starts(every)) == servable and bool(every.mask.all())
    assert np.array_equal(every.obs[:, 1:, 0], every.obs[:, :-1, 0] + 1)  # contiguous


@pytest.mark.parametrize("sampler", [None, PLAIN], ids=["uniform", "per"])
def test_too_many_distinct_windows_are_refused_before_anything_is_drawn(sampler: Any) -> None:
    buf = buffer(sampler, None if sampler is None else zero_early_lane1())
    twin = buffer(sampler, None if sampler is None else zero_early_lane1())
    n = 38 if sampler is None else 33
    with pytest.raises(EmptyBufferError, match=rf"sample_sequences\(batch_size={n + 1}, "
                       rf"width=3, .*replace=False\): the buffer holds {n} distinct windows "
                       rf".*lower batch_size to at most {n}, use replace=True"):
        buf.sample_sequences(n + 1, L, replace=False)
    # nothing was drawn: the generator and the beta schedule are as the twin's
    assert buf.rng.bit_generator.state == twin.rng.bit_generator.state
    assert getattr(buf.sampler, "calls", 0) == getattr(twin.sampler, "calls", 0)
    for replace in (False, True):
        assert starts(buf.sample_sequences(8, L, replace=replace)) == \
            starts(twin.sample_sequences(8, L, replace=replace))
    # no lane holds a window of 31 steps: nothing to lower batch_size to
    with pytest.raises(EmptyBufferError, match=r"holds 0 distinct windows .*; add more data"):
        buf.sample_sequences(1, 31, replace=False)


def test_a_sampler_that_cannot_draw_among_given_keys_is_refused() -> None:
    buf = rb.from_config({"capacity": 64, "num_envs": 2, "seed": 0,
                          "sampler": {"type": "lane_split"}})
    buf.extend(**episodes())
    with pytest.raises(ConfigError, match=r"sample_sequences\(replace=False\): the sampler "
                       r"\(LaneSplitSampler\) cannot draw distinct windows"):
        buf.sample_sequences(4, L, replace=False)


@pytest.mark.statistical
def test_uniform_distinct_windows_are_a_uniform_subset_of_usable_starts() -> None:
    """12 distinct windows of the 10 + 28 usable starts of lanes 0 and 1: lane 0's share
    is hypergeometric (a split by steps, 30 + 30, would give it 6 on average, not 3.2)."""
    buf = buffer(None)
    from_lane0 = np.array([sum(i < 1000 for i in starts(buf.sample_sequences(
        12, L, replace=False))) for _ in range(600)])
    cells_o, cells_e = hypergeometric_cells(from_lane0, 10, 28, 12)
    stat = float(((cells_o - cells_e) ** 2 / cells_e).sum())
    assert stat < chi2_critical(len(cells_o) - 1)


@pytest.mark.statistical
def test_prioritized_distinct_windows_are_successive_sampling_over_usable_starts() -> None:
    """How often each servable start is left out of 26 distinct windows of 33 matches a
    Gumbel top-k simulation over the servable starts' priorities (and not equal odds);
    probabilities and weights are the single-draw ones of ``replace=True``."""
    prio = zero_early_lane1()
    buf = buffer(PLAIN, prio)
    servable = sorted(i for lane in range(2) for t in range(30)
                      if usable(i := 1000 * lane + t) and prio[t, lane] > 0)
    p = np.array([prio[i % 1000, i // 1000] for i in servable])
    p_out = 1.0 - successive_inclusion(p, 26)
    ref = buf.sample_sequences(4000, L, beta=0.7)
    prob = dict(zip(starts(ref), ref.probabilities.tolist(), strict=True))
    weight = dict(zip(starts(ref), ref.weights.tolist(), strict=True))
    calls = 600
    out = dict.fromkeys(servable, 0)
    for _ in range(calls):
        b = buf.sample_sequences(26, L, replace=False, beta=0.7)
        got = starts(b)
        np.testing.assert_allclose(b.probabilities, [prob[i] for i in got], rtol=1e-12)
        assert b.weights.tolist() == [weight[i] for i in got]
        for i in set(out) - set(got):
            out[i] += 1
    observed = np.array([out[i] for i in servable], float)
    stat = float(((observed - p_out * calls) ** 2 / (p_out * calls)).sum())
    assert stat < chi2_critical(len(servable) - 1)
    flat = np.full(len(servable), 7 / 33 * calls)
    assert float(((observed - flat) ** 2 / flat).sum()) > chi2_critical(len(servable) - 1)
