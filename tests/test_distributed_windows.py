"""Exact sequence windows over shards: one buffer's law conditioned on usable starts.

The client interleaves the shards' independently drawn candidate starts by one label
stream and keeps the first ``B`` usable ones (:mod:`replaybank.distributed.rejection`).
Checked here: the stream against a plain-loop oracle on the same labels and candidates
(top-ups included), its law against the exact conditional law (and not the old split by
shard mass), and on a real local Ray the windows' law, probabilities and weights against
one buffer holding the same data, with shards whose episodes differ in length.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.distributed.rejection import CandidateStream, candidate_counts
from replaybank.errors import EmptyBufferError
from tests.distributed_ray import start, steps
from tests.stats import chi2_critical
from tests.test_distinct_windows import episodes


def chi2_ok(observed: np.ndarray, expected: np.ndarray) -> bool:
    """Goodness of fit at the 0.1% level (cells with some expectation only)."""
    keep = expected > 0
    assert observed[~keep].sum() == 0, "drew an item of probability 0"
    o, e = observed[keep], expected[keep]
    return float(((o - e) ** 2 / e).sum()) < chi2_critical(len(o) - 1)


class Shards:
    """Fake shards: item ``i`` of shard ``s`` has priority ``p[s][i]`` and is a usable
    start when ``u[s][i]``; a reply draws candidates i.i.d. from ``p / total``."""

    def __init__(self, p: list[np.ndarray], u: list[np.ndarray], seed: int) -> None:
        self.p, self.u = p, u
        self.rng = np.random.default_rng(seed)
        self.drawn: dict[int, list[np.ndarray]] = {s: [] for s in range(len(p))}

    def reply(self, s: int, n: int) -> dict[str, Any]:
        p = self.p[s]
        idx = self.rng.choice(len(p), size=n, p=p / p.sum())
        self.drawn[s].append(idx)
        ok = self.u[s][idx]
        gid = idx[ok] * len(self.p) + s  # a global id: item * S + shard
        return {"usable": ok, "mass": (len(p), float(p.sum()), float(p.min())),
                "fields": {"starts": gid} if ok.any() else None,
                "priorities": p[idx[ok]] if ok.any() else None}


def run(stream: CandidateStream, shards: Shards, first: dict[int, int]) -> int:
    """Feed ``stream`` until it is done; returns the round trips taken."""
    want: dict[int, int] | None = first
    trips = 0
    while want:
        for s, c in want.items():
            stream.add(s, shards.reply(s, c))
        want = stream.consume()
        trips += 1
        assert trips < 200
    return trips


class RecordingRng:
    """A generator whose ``choice`` draws are recorded (the labels of the stream)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.labels: list[np.ndarray] = []

    def choice(self, n: int, size: int, p: np.ndarray) -> np.ndarray:
        out = self.rng.choice(n, size=size, p=p)
        self.labels.append(out)
        return out


def oracle(labels: np.ndarray, drawn: dict[int, np.ndarray], u: list[np.ndarray],
           b: int) -> tuple[dict[int, list[int]], int]:
    """Plain loop: walk the labels, take each shard's next candidate, keep the usable
    ones until ``b``; returns the kept item ids per shard (in order) and labels used."""
    nxt = dict.fromkeys(drawn, 0)
    kept: dict[int, list[int]] = {s: [] for s in drawn}
    got = used = 0
    for lab in labels.tolist():
        if got == b:
            break
        item = int(drawn[lab][nxt[lab]])
        nxt[lab] += 1
        used += 1
        if u[lab][item]:
            kept[lab].append(item)
            got += 1
    assert got == b
    return kept, used


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4),
       b=st.integers(1, 40), first=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_stream_takes_what_a_plain_loop_takes(sizes: list[int], b: int, first: int,
                                              seed: int) -> None:
    gen = np.random.default_rng(seed)
    p = [gen.uniform(0.1, 3.0, n) for n in sizes]
    u = [gen.random(n) < 0.5 for n in sizes]
    u[0][0] = True  # something is usable
    shards = Shards(p, u, seed)
    rng = RecordingRng(seed + 1)
    live = list(range(len(sizes)))
    stream = CandidateStream(live, b, rng)  # type: ignore[arg-type]
    run(stream, shards, dict.fromkeys(live, first))  # small first asks: top-ups
    drawn = {s: np.concatenate(shards.drawn[s]) for s in live}
    kept, used = oracle(np.concatenate(rng.labels), drawn, u, b)
    assert stream.accepted == b and stream.consumed == used
    parts = {int(q["fields"]["starts"][0]) % len(sizes): q for q in stream.parts()}
    for s in live:
        if not kept[s]:
            assert s not in parts
            continue
        got = parts[s]["fields"]["starts"]
        assert (got // len(sizes)).tolist() == kept[s]
        np.testing.assert_array_equal(parts[s]["priorities"], p[s][kept[s]])
        assert parts[s]["mass"] == (sizes[s], float(p[s].sum()), float(p[s].min()))


@pytest.mark.statistical
@pytest.mark.parametrize("first", [1, 400], ids=["top-ups", "one-trip"])
def test_stream_law_is_the_conditional_law_not_the_mass_split(first: int) -> None:
    """Shard 0 has a third of its items usable, shard 1 nearly all: the windows follow
    ``p_i u_i / sum(p u)``; the split by shard mass gives shard 0 far more."""
    gen = np.random.default_rng(3)
    p = [gen.uniform(0.5, 2.0, 30), gen.uniform(0.5, 2.0, 30)]
    u = [np.arange(30) % 3 == 0, np.arange(30) < 28]
    shards = Shards(p, u, 4)
    rng = np.random.default_rng(5)
    counts = np.zeros(60)
    for _ in range(150):
        stream = CandidateStream([0, 1], 64, rng)
        run(stream, shards, {0: first, 1: first})
        for q in stream.parts():
            np.add.at(counts, q["fields"]["starts"], 1)
    ids = np.arange(60)
    pu = np.where(np.r_[u[0], u[1]][ids % 2 * 30 + ids // 2],
                  np.r_[p[0], p[1]][ids % 2 * 30 + ids // 2], 0.0)
    exact = pu / pu.sum() * counts.sum()
    assert chi2_ok(counts, exact)
    # the split by mass: shard s gets total_s / total, then the conditional law inside
    split = np.zeros(60)
    for s in (0, 1):
        mine = ids % 2 == s
        split[mine] = pu[mine] / pu[mine].sum() * p[s].sum() / (p[0].sum() + p[1].sum())
    assert not chi2_ok(counts, split / split.sum() * counts.sum())


def test_stream_refuses_zero_mass_and_counts_are_padded() -> None:
    stream = CandidateStream([0], 4, np.random.default_rng(0))
    stream.add(0, {"usable": np.zeros(0, bool), "mass": (3, 0.0, math.inf),
                   "fields": None, "priorities": None})
    with pytest.raises(EmptyBufferError, match="hold nothing to draw"):
        stream.consume()
    # no items at all: a local buffer's words
    stream = CandidateStream([0], 4, np.random.default_rng(0))
    stream.add(0, {"usable": np.zeros(0, bool), "mass": (0, 0.0, math.inf),
                   "fields": None, "priorities": None})
    with pytest.raises(EmptyBufferError, match=r"^sample_sequences\(batch_size=4\): the "
                       "buffer is empty; add transitions first"):
        stream.consume()
    # a guess covers B / rate labels, padded; a tiny rate is clamped, the size capped
    c = candidate_counts(256, 0.5, {0: 0.25, 1: 0.75})
    assert c[0] > 0.25 * 512 and c[1] > 0.75 * 512
    assert candidate_counts(256, 0.0, {0: 1.0})[0] == candidate_counts(256, 1 / 64, {0: 1.0})[0]
    assert candidate_counts(10**6, 1e-3, {0: 1.0})[0] == 1 << 16


@pytest.mark.parametrize("strict", [True, False])
def test_shard_candidates_flag_exactly_the_usable_starts(strict: bool) -> None:
    """``sequence_candidates`` on one buffer (what a shard runs): the starts are the
    sampler's independent draws, the usable flags equal a plain-loop check of each, and
    the windows are the usable starts' windows in draw order."""
    from replaybank.buffers.sequences import sequence_candidates

    buf = rb.ReplayBuffer(capacity=64, num_envs=2, seed=0)
    data = episodes()
    buf.extend(**data)
    burn = 0 if strict else 2
    need = L + burn if strict else burn + 1

    def inside(lane: int, t: int) -> int:
        """Plain loop: steps of the window from ``t`` inside its episode (lane 0 ends
        one every 3 steps, lane 1 none) and below the 30 written."""
        n = 0
        for j in range(L + burn):
            if t + j >= 30 or (lane == 0 and (t + j) // 3 != t // 3):
                break
            n += 1
        return n

    for _ in range(5):
        twin = np.random.default_rng()
        twin.bit_generator.state = buf.rng.bit_generator.state
        keys = buf.sampler_traits.independent.draw_independent(200, buf.lane_view(), twin)
        usable, sb = sequence_candidates(buf.table, buf.lane_view(), buf.rng,
                                         buf.sampler_traits, 200, L, strict=strict,
                                         burn_in=burn)
        lane, t = keys % 2, keys // 2  # key = seq * lanes + lane; no wrap (30 of 32)
        want = [inside(int(a), int(b)) >= need for a, b in zip(lane, t, strict=True)]
        assert usable.tolist() == want and 0 < sum(want) < 200
        assert sb is not None
        ids = (1000 * lane + t)[usable]
        np.testing.assert_array_equal(sb.obs[:, 0, 0], ids)  # draw order
        np.testing.assert_array_equal(sb.mask.sum(axis=1),
                                      [min(inside(int(i) // 1000, int(i) % 1000), L + burn)
                                       - burn for i in ids])


# ---------------------------------------------------------------- on a real Ray
ray = pytest.importorskip("ray")
PER = {"type": "prioritized", "alpha": 0.6, "beta": 0.4, "kernel": "numpy"}
L = 3  # window length


def usable_start(i: int) -> bool:
    """Whether step id ``i`` starts a full window of ``L`` steps inside its episode."""
    lane, t = divmod(i, 1000)
    return t % 3 == 0 if lane == 0 else t <= 30 - L


def filled(services: list[Any], sampler: Any) -> tuple[Any, Any, Any, np.ndarray]:
    cfg: dict[str, Any] = {"capacity": 64, "seed": 0}
    if sampler is not None:
        cfg["sampler"] = sampler
    svc = start(services, 2, cfg, num_lanes=2, seed=1)
    single = rb.from_config({**cfg, "num_envs": 2})
    data = episodes()
    prio = np.random.default_rng(2).uniform(0.2, 4.0, (30, 2))
    client = svc.client(max_rows=7)
    kw = {} if sampler is None else {"priority": prio}
    client.extend(**data, **kw)
    single.extend(**data, **kw)
    client.flush()
    return svc, client, single, prio


def law(single: Any, sampler: Any, prio: np.ndarray) -> dict[int, float]:
    """One buffer's window law: its unconditional law restricted to usable starts."""
    ref = single.sample(20_000)
    ids = ref.obs[:, 0].astype(np.int64).tolist()
    p = dict.fromkeys(ids, 1.0) if sampler is None else \
        dict(zip(ids, ref.probabilities.tolist(), strict=True))
    assert len(p) == 60
    mass = {i: q for i, q in p.items() if usable_start(i)}
    tot = sum(mass.values())
    return {i: q / tot for i, q in mass.items()}


@pytest.mark.statistical
@pytest.mark.parametrize("sampler", [None, PER], ids=["uniform", "per"])
def test_windows_follow_one_buffers_law_across_shards(services: Any, sampler: Any) -> None:
    _, client, single, prio = filled(services, sampler)
    want = law(single, sampler, prio)
    # one buffer with the same data draws from this law (the reference is right)
    ref = single.sample_sequences(4000, L)
    assert all(usable_start(i) for i in ref.obs[:, 0, 0].astype(np.int64).tolist())
    counts: dict[int, int] = dict.fromkeys(want, 0)
    draws = 0
    for _ in range(60):
        b = client.sample_sequences(128, L)
        assert b.obs.shape == (128, L, 2) and bool(b.mask.all())
        assert np.array_equal(b.obs[:, 1:, 0], b.obs[:, :-1, 0] + 1)  # contiguous
        for i in b.obs[:, 0, 0].astype(np.int64).tolist():
            counts[i] += 1  # KeyError: an unusable start
        draws += 128
    keys = sorted(want)
    observed = np.array([counts[k] for k in keys], float)
    assert chi2_ok(observed, np.array([want[k] for k in keys]) * draws)
    # the split by shard mass would give shard 0 (lane 0) about half of the windows
    share0 = observed[np.array(keys) < 1000].sum() / draws
    exact0 = sum(q for k, q in want.items() if k < 1000)
    assert abs(share0 - exact0) < 0.03 and exact0 < 0.4
    assert client.draw_paths["two_trips"] == 0


def test_window_weights_and_probabilities_are_one_buffers(services: Any) -> None:
    _, client, single, _ = filled(services, PER)
    ref = single.sample_sequences(4000, L, beta=0.7)
    ids = ref.obs[:, 0, 0].astype(np.int64).tolist()
    prob = dict(zip(ids, ref.probabilities.tolist(), strict=True))
    weight = dict(zip(ids, ref.weights.tolist(), strict=True))
    for _ in range(5):
        b = client.sample_sequences(64, L, beta=0.7)
        got = b.obs[:, 0, 0].astype(np.int64).tolist()
        np.testing.assert_allclose(b.probabilities, [prob[i] for i in got], rtol=1e-12)
        assert b.weights.tolist() == [weight[i] for i in got]


@pytest.mark.statistical
def test_top_up_trips_keep_the_law(services: Any) -> None:
    """Shard 1 looked empty in the previous reply, so it is asked for a few candidates
    only and the stream needs more of them in further round trips."""
    svc, client, single, prio = filled(services, None)
    want = law(single, None, prio)
    counts: dict[int, int] = dict.fromkeys(want, 0)
    paths = dict(client.draw_paths)
    for _ in range(40):
        client._seen = [1.0, 0.0]
        b = client.sample_sequences(128, L)
        for i in b.obs[:, 0, 0].astype(np.int64).tolist():
            counts[i] += 1
    assert client.draw_paths["top_up"] >= paths["top_up"] + 35
    # the usable rate that sizes the next draw is sampling state: JSON-able, restored
    state = json.loads(json.dumps(client.state_dict()))
    assert state["window_rates"] and 0.2 < state["window_rates"][0][2] / \
        state["window_rates"][0][3] < 0.8  # 38 usable starts of 60
    other = svc.client()
    other.load_state_dict(state)
    assert other.state_dict() == client.state_dict()
    keys = sorted(want)
    observed = np.array([counts[k] for k in keys], float)
    assert chi2_ok(observed, np.array([want[k] for k in keys]) * 40 * 128)


def test_no_usable_window_raises_and_leaves_the_client_as_it_was(services: Any) -> None:
    _, client, _, _ = filled(services, None)
    before = client.state_dict()
    # lane 0's episodes are 3 steps and lane 1 has 30: no window of 31 steps fits, but
    # strict=False windows of burn-in 31 do not exist either (1 loss step needs 32)
    with pytest.raises(EmptyBufferError, match="usable windows"):
        client.sample_sequences(8, 1, burn_in=31, strict=False)
    assert client.state_dict() == before
    b = client.sample_sequences(8, L)  # and the client still works
    assert all(usable_start(i) for i in b.obs[:, 0, 0].astype(np.int64).tolist())


#: sample / sample_sequences calls with a bad argument, on a buffer and on the client
BAD_DRAWS: dict[str, Any] = {
    "burn_in=-1": lambda b: b.sample_sequences(2, 2, burn_in=-1),
    "episode_boundary='xx'": lambda b: b.sample_sequences(2, 2, episode_boundary="xx"),
    "strict='yes'": lambda b: b.sample_sequences(2, 2, strict="yes"),
    "unknown keyword": lambda b: b.sample_sequences(2, 2, foo=1),
    "sequence_length longer than a lane": lambda b: b.sample_sequences(2, 9),
    "sequence_length=0": lambda b: b.sample_sequences(2, 0),
    "sequence_length=2.0": lambda b: b.sample_sequences(2, 2.0),
    "sample_sequences(batch_size=0)": lambda b: b.sample_sequences(0, 2),
    "sample(batch_size=0)": lambda b: b.sample(0),
    "sample(batch_size=True)": lambda b: b.sample(True),
}


@pytest.mark.parametrize("case", sorted(BAD_DRAWS))
def test_bad_window_arguments_name_the_users_call(services: Any, case: str) -> None:
    """Over two shards the client's exact windows are drawn by the shards'
    sequence_candidates, whose errors named that internal call
    (``sequence_candidates(burn_in=-1): ...``), and the client's own checks of
    batch_size/sequence_length named no call (``sequence_length=0: ...``). A buffer
    names the user's call: the client now says what it says (type and message), and the
    refused call changes neither the client's sampling state nor any shard."""
    svc = start(services, 2, {"capacity": 8}, num_lanes=2, seed=0)
    client = svc.client(max_rows=1)
    client.extend(**steps(2, 0, 4))
    client.flush()
    local = rb.ReplayBuffer(16, num_envs=2)  # 8 rows per lane, as each shard's lane
    local.extend(**steps(2, 0, 4))
    call = BAD_DRAWS[case]
    with pytest.raises(rb.errors.ReplayBankError) as want:
        call(local)
    state, shards = client.state_dict(), svc.stats()["shards"]
    with pytest.raises(type(want.value)) as got:
        call(client)
    assert type(got.value) is type(want.value)
    assert str(got.value) == str(want.value)
    assert str(got.value).startswith(("sample(", "sample_sequences("))
    assert client.state_dict() == state and svc.stats()["shards"] == shards
