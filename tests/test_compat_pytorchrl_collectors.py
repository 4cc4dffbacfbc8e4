"""pytorchrl's collection workers -> gradient worker flow with a recurrent actor (reference
003, 'Replay buffer': get_all_buffer_data, reset, insert_data_slice, generate_batches),
against a plain-Python model of what pytorchrl's storage presents.

Each collector storage inserts its env steps, exports with ``get_all_buffer_data`` and
calls ``reset()``; the learner storage appends every export with ``insert_data_slice``.
pytorchrl stores each export whole and draws only aligned sequences inside one export,
so a sequence is always consecutive steps of one collector's trajectory, with the
hidden state stored at its first step and ``Done`` where an episode starts. The front
end draws windows at any start; the model below says which windows it may draw (those
inside one segment: an export, extended by the next export of the same collector when
that one begins by re-sending the newest stored rows) and the tests check every drawn
window against it, field by field.

A ``HERBuffer`` learner (feed-forward or recurrent) fed the same way relabels each
collector's own episodes: the tests check every ``her_function`` call against a plain
loop that follows each collector's stream of exports by the collector's name.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from replaybank.compat.pytorchrl import (  # noqa: E402
    EREBuffer,
    HERBuffer,
    PERBuffer,
    ReplayBuffer,
)
from replaybank.compat.pytorchrl.segments import Segments  # noqa: E402
from replaybank.compat.pytorchrl.streams import MAX_STREAMS, Stream, Streams  # noqa: E402
from replaybank.errors import EmptyBufferError  # noqa: E402

OBS, RHS, DONE, ACT, REW = ("Observation", "RecurrentHiddenStates", "Done", "Action",
                            "Reward")
OBS2, RHS2, DONE2 = "NextObservation", "NextRecurrentHiddenStates", "NextDone"
SEQ = 6  # algorithm.update_every: windows of 3 burn-in (overlap) + 3 trained steps
OVERLAP = 3
ACTOR = SimpleNamespace(is_recurrent=True, sequence_overlap=0.5)
ALGO = SimpleNamespace(gamma=0.9, update_every=SEQ)
ENVS = 2
#: Episode length of each collector's envs (episodes end inside the windows).
PERIOD = {0: 7, 1: 5}

Key = tuple[int, int, int]  # (collector, env, t): one env step of one collector


# ------------------------------------------------------------------ the env steps
def obs_of(source: int, env: int, t: int) -> int:
    return 10000 * (source + 1) + 1000 * env + t


def decode(value: float) -> Key:
    v = int(value)
    return v // 10000 - 1, v % 10000 // 1000, v % 1000


def first_of_episode(source: int, t: int) -> bool:
    return t % PERIOD[source] == 0


def hidden(source: int, env: int, t: int) -> float:
    """The actor's hidden state before step t: zero at an episode start, as a recurrent
    pytorchrl actor resets it there."""
    return 0.0 if first_of_episode(source, t) else float(obs_of(source, env, t))


def transition(source: int, t: int) -> dict[str, Any]:
    """pytorchrl's transition dict of step t of every env of collector ``source``."""
    def col(f: Any) -> Any:
        return torch.tensor([[float(f(e))] for e in range(ENVS)])

    return {OBS: col(lambda e: obs_of(source, e, t)),
            RHS: torch.tensor([[hidden(source, e, t), -hidden(source, e, t)]
                               for e in range(ENVS)]),
            DONE: col(lambda e: first_of_episode(source, t)),
            ACT: col(lambda e: t % 3), REW: col(lambda e: obs_of(source, e, t) / 8),
            OBS2: col(lambda e: obs_of(source, e, t + 1)),
            RHS2: torch.tensor([[hidden(source, e, t + 1), -hidden(source, e, t + 1)]
                                for e in range(ENVS)]),
            DONE2: col(lambda e: first_of_episode(source, t + 1))}


def collect(learner: Any, rounds: list[tuple[int, int]], data_to_cpu: bool = True,
            seed: int = 0, actor: Any = ACTOR,
            algo: Any = ALGO) -> list[tuple[int, list[int]]]:
    """pytorchrl's collection -> gradient worker flow: in each round collector ``source``
    inserts ``steps`` steps, exports, resets, and the learner inserts the export (the
    collectors are built for ``actor`` and ``algo``: recurrent unless told otherwise).
    Returns the exports as ``(source, [t, ...])``, in the order the learner got them."""
    collectors: dict[int, Any] = {}
    clock: Counter[int] = Counter()
    sent = []
    for source, steps in rounds:
        col = collectors.setdefault(
            source, ReplayBuffer(500, "cpu", actor, algo, None, seed=seed + source))
        for _ in range(steps):
            col.insert_transition(transition(source, clock[source]))
            clock[source] += 1
        data = col.get_all_buffer_data(data_to_cpu=data_to_cpu)
        col.reset()
        ts = [decode(v)[2] for v in data[OBS][:, 0, 0].tolist()]
        assert all(decode(v)[0] == source for v in data[OBS][:, 0, 0].tolist())
        sent.append((source, ts))
        learner.insert_data_slice(data)
    return sent


# ------------------------------------------------------------------ the model
def model_segments(sent: list[tuple[int, list[int]]],
                   overlap: int = OVERLAP) -> list[list[tuple[int, int]]]:
    """Plain loop: the learner's stored rows, as segments of (collector, t). An export
    whose first ``overlap`` rows are the newest stored rows (the overlap its collector
    re-sends) continues them without those rows; any other export starts a segment of
    its own, stored whole, as pytorchrl stores every export."""
    stored: list[tuple[int, int]] = []
    segments: list[list[tuple[int, int]]] = []
    for source, ts in sent:
        rows = [(source, t) for t in ts]
        if segments and overlap and len(stored) >= overlap and rows[:overlap] == stored[-overlap:]:
            segments[-1].extend(rows[overlap:])
            stored.extend(rows[overlap:])
        else:
            segments.append(rows)
            stored.extend(rows)
    return segments


def model_windows(segments: list[list[tuple[int, int]]]) -> set[tuple[Key, ...]]:
    """Every window of SEQ rows inside one segment, in every env's lane."""
    out = set()
    for seg in segments:
        for i in range(len(seg) - SEQ + 1):
            for env in range(ENVS):
                out.add(tuple((s, env, t) for s, t in seg[i:i + SEQ]))
    return out


def pytorchrl_sequences(sent: list[tuple[int, list[int]]]) -> set[tuple[Key, ...]]:
    """The sequences pytorchrl's learner draws: aligned, inside one export."""
    out = set()
    for source, ts in sent:
        for j in range(len(ts) // SEQ):
            for env in range(ENVS):
                out.add(tuple((source, env, t) for t in ts[j * SEQ:(j + 1) * SEQ]))
    return out


def is_trajectory(window: tuple[Key, ...]) -> bool:
    """Consecutive steps of one env of one collector (what a pytorchrl sequence is)."""
    s, e, t = window[0]
    return list(window) == [(s, e, t + i) for i in range(len(window))]


def drawn_windows(batch: dict[str, Any]) -> list[tuple[Key, ...]]:
    """Each window of a recurrent batch, checked row by row against the env steps: the
    stored hidden state at its first step, Done where an episode starts, the step's own
    action, reward and next step."""
    obs = batch[OBS][:, 0].numpy().reshape(-1, SEQ)  # [S, SEQ]
    windows = [tuple(decode(v) for v in w) for w in obs.tolist()]
    for i, w in enumerate(windows):
        s, e, t = w[0]
        assert batch[RHS][i].tolist() == [hidden(s, e, t), -hidden(s, e, t)], w
        rows = slice(i * SEQ, (i + 1) * SEQ)
        assert batch[DONE][rows, 0].tolist() == [float(first_of_episode(s, k[2])) for k in w]
        assert batch[DONE2][rows, 0].tolist() == [float(first_of_episode(s, k[2] + 1))
                                                  for k in w]
        assert batch[OBS2][rows, 0].tolist() == [float(obs_of(s, e, k[2] + 1)) for k in w]
        assert batch[ACT][rows, 0].tolist() == [float(k[2] % 3) for k in w]
        assert batch[REW][rows, 0].tolist() == pytest.approx([obs_of(*k) / 8 for k in w])
    return windows


def stored_rows(learner: Any) -> list[tuple[int, int]]:
    keys = [decode(v) for v in learner.data[OBS][:, 0, 0].tolist()]
    return [(s, t) for s, _, t in keys]


def check_draws(learner: Any, sent: list[tuple[int, list[int]]], batches: int = 6,
                mini_batch_size: int = 300) -> Counter[tuple[Key, ...]]:
    """Draw ``batches`` batches and check each window against the model; returns how
    often each window was drawn."""
    allowed = model_windows(model_segments(sent))
    seen: Counter[tuple[Key, ...]] = Counter()
    for batch in learner.generate_batches(batches, mini_batch_size):
        for w in drawn_windows(batch):
            assert is_trajectory(w), f"window {w} joins two trajectories"
            assert w in allowed, f"window {w} is not inside one segment"
            seen[w] += 1
    return seen


# ------------------------------------------------------------------ the tests
def test_two_collectors_windows_stay_in_one_collectors_trajectory() -> None:
    """Two collection workers send to one gradient worker (exports interleaved, some
    steps held back): every window is consecutive steps of one collector's env, with its
    stored hidden state and Done flags, and the windows drawn are exactly those of the
    model, uniformly. Each export that does not continue the newest stored rows is kept
    whole (its re-sent overlap is the burn-in of its first window, never a trained
    step), as pytorchrl keeps every export; so every sequence pytorchrl would draw is
    drawn."""
    learner = ReplayBuffer(500, "cpu", ACTOR, ALGO, None, seed=3)
    sent = collect(learner, [(0, 6), (1, 6), (0, 6), (1, 9), (0, 12), (1, 4), (0, 6),
                             (1, 8)])
    segments = model_segments(sent)
    assert stored_rows(learner) == [row for seg in segments for row in seg]
    assert len(segments) == len(sent)  # interleaved: no export continues the newest rows
    seen = check_draws(learner, sent, batches=20, mini_batch_size=600)
    allowed = model_windows(segments)
    assert set(seen) == allowed
    assert pytorchrl_sequences(sent) <= allowed
    # every step but each collector's first OVERLAP (burn-in only) is trained (after a
    # window's burn-in) in one segment only: a re-sent overlap kept again is burn-in
    where: dict[Key, set[int]] = {}
    for i, seg in enumerate(segments):
        for w in model_windows([seg]):
            for key in w[OVERLAP:]:
                where.setdefault(key, set()).add(i)
    assert all(len(found) == 1 for found in where.values())
    assert set(where) == {(s, e, t) for s, ts in sent for t in ts for e in range(ENVS)
                          if t >= OVERLAP}
    # uniform over the allowed windows (rejection keeps the sampler's law)
    counts = np.array([seen[w] for w in sorted(allowed)], dtype=np.float64)
    expected = counts.sum() / len(counts)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < len(counts) + 6 * np.sqrt(2 * len(counts))


def test_the_probes_two_collector_flow() -> None:
    """The probe's scenario (one env, two rounds of two collectors sending update_every
    steps each): no window mixes the collectors."""
    learner = ReplayBuffer(100, "cpu", ACTOR, ALGO, None, seed=0)
    sent = collect(learner, [(0, 6), (1, 6), (0, 6), (1, 6)])
    windows = check_draws(learner, sent, batches=2)
    assert all(len({k[0] for k in w}) == 1 for w in windows)
    assert set(windows) == model_windows(model_segments(sent))


def test_one_collector_without_staging_windows_skip_the_gap() -> None:
    """One collector exporting with data_to_cpu=False stages nothing: the rows held back
    after its last whole sequence are dropped by reset(), so its next export does not
    continue the previous one. No window crosses that gap."""
    learner = ReplayBuffer(500, "cpu", ACTOR, ALGO, None, seed=1)
    sent = collect(learner, [(0, 8), (0, 8), (0, 10), (0, 7)], data_to_cpu=False)
    assert [ts[0] for _, ts in sent] == [0, 8, 16, 26]  # 6-7, 14-15, ... were dropped
    segments = model_segments(sent)
    assert len(segments) == 4
    assert stored_rows(learner) == [row for seg in segments for row in seg]
    seen = check_draws(learner, sent, batches=10)
    assert set(seen) == model_windows(segments)


def test_one_collector_normal_flow_is_unchanged() -> None:
    """One collector exporting with data_to_cpu=True (the usual flow): its re-sent
    overlap is stored once, every step once and in order, and windows run across the
    joins of its exports as over a storage that collected the steps itself: the
    learner's batches are those of such a storage, bit for bit."""
    learner = ReplayBuffer(500, "cpu", ACTOR, ALGO, None, seed=5)
    sent = collect(learner, [(0, 8), (0, 6), (0, 9), (0, 12), (0, 5)])
    segments = model_segments(sent)
    assert len(segments) == 1
    steps = len(segments[0])
    assert stored_rows(learner) == [(0, t) for t in range(steps)]
    direct = ReplayBuffer(500, "cpu", ACTOR, ALGO, None, seed=5)
    for t in range(steps):
        direct.insert_transition(transition(0, t))
    for a, b in zip(learner.generate_batches(3, 120), direct.generate_batches(3, 120),
                    strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert (torch.equal(a[key], b[key]) if torch.is_tensor(a[key])
                    else a[key] == b[key]), key
    seen = check_draws(learner, sent, batches=10)
    assert set(seen) == model_windows(segments)
    # the first new row of each later export
    joins = [ts[OVERLAP] for _, ts in sent[1:]]
    assert [w for w in seen if any(w[0][2] < j <= w[-1][2] for j in joins)]


def test_two_collectors_with_per_and_ere() -> None:
    """PER (priorities per window start, after_gradients) and ERE (recent windows) over
    the two-collector flow: the windows stay inside one segment, and the PER weights
    are those of the windows drawn."""
    per = PERBuffer(500, "cpu", ACTOR, ALGO, None, alpha=0.6, beta=0.4, epsilon=0.01,
                    default_error=1.0, seed=2)
    sent = collect(per, [(0, 6), (1, 6), (0, 9), (1, 12), (0, 6)])
    check_draws(per, sent, batches=2)
    batch = next(per.generate_batches(1, 120))
    drawn_windows(batch)
    errors = torch.arange(len(batch["idxs"]) * OVERLAP, dtype=torch.float32)
    per.after_gradients(batch, {"Algorithm": {"errors": errors}})
    seen = check_draws(per, sent, batches=4)
    assert set(seen) <= model_windows(model_segments(sent))
    batch = next(per.generate_batches(1, 300))
    core = per.buffer.sampler
    slots = per.buffer.table.slots_of(np.asarray(batch["idxs"]))
    p = core.priorities(slots)  # [S]
    n = len(per.buffer)
    all_p = core.priorities(per.buffer.table.slots_of(np.arange(n)))
    weights = (n * p / all_p.sum()) ** -0.4 / (n * all_p.min() / all_p.sum()) ** -0.4
    np.testing.assert_allclose(batch["per_weights"][::SEQ, 0].numpy(), weights, rtol=1e-5)
    ere = EREBuffer(500, "cpu", ACTOR, ALGO, None, eta=0.9, cmin=4 * SEQ * ENVS, seed=4)
    sent = collect(ere, [(0, 6), (1, 6), (0, 9), (1, 12), (0, 6), (1, 6)])
    check_draws(ere, sent, batches=4)


def test_no_window_inside_one_slice_raises() -> None:
    """Slices shorter than a sequence from different collectors hold no window inside
    one slice: generate_batches says so (sequence_length, the slices' lengths, the fix)
    instead of joining them."""
    learner = ReplayBuffer(100, "cpu", ACTOR, ALGO, None, seed=0)
    for source in (0, 1, 0):
        data = {k: torch.stack([transition(source, t)[k] for t in range(4)])
                for k in (OBS, RHS, DONE, ACT, REW, OBS2, RHS2, DONE2)}
        learner.insert_data_slice(data)
    assert learner.size == 12
    with pytest.raises(EmptyBufferError, match=r"sequence_length=6.*\[4, 4, 4\]"):
        next(learner.generate_batches(1, 12))


def test_windows_that_stay_too_rare_raise_and_draw_nothing() -> None:
    """ERE's recent window holding only windows that join two slices: after the redraw
    rounds generate_batches raises, and the generator is as before the call."""
    ere = EREBuffer(500, "cpu", ACTOR, ALGO, None, eta=0.5, cmin=8 * ENVS, seed=0)
    collect(ere, [(0, 12)])
    for source in (1, 0):  # two 4-row slices: the newest 8 rows hold no whole window
        data = {k: torch.stack([transition(source, 50 + t)[k] for t in range(4)])
                for k in (OBS, RHS, DONE, ACT, REW, OBS2, RHS2, DONE2)}
        ere.insert_data_slice(data)
    batches = ere.generate_batches(2, 12)
    drawn_windows(next(batches))  # mini batch 0: the whole buffer
    state = ere.buffer.rng.bit_generator.state
    with pytest.raises(EmptyBufferError, match="joined two inserted slices"):
        next(batches)  # mini batch 1: the newest 8 rows per env
    assert ere.buffer.rng.bit_generator.state == state


def test_resent_rows_are_recognised_on_every_stored_key() -> None:
    """A slice whose first rows repeat the newest rows' observations, actions, rewards
    and flags but not their hidden states is another trajectory: it is kept whole and
    starts a segment (only an exact re-send continues the stored rows), so no window
    runs from the stored rows into it."""
    learner = ReplayBuffer(100, "cpu", ACTOR, ALGO, None, seed=0)
    collect(learner, [(0, 12)])  # rows 0-11
    data = {k: torch.stack([transition(0, t)[k] for t in range(9, 18)])
            for k in (OBS, RHS, DONE, ACT, REW, OBS2, RHS2, DONE2)}
    data[RHS] = data[RHS] + 0.5  # steps 9-17 again, with another actor's hidden states
    learner.insert_data_slice(data)
    assert learner.size == 12 + 9
    for batch in learner.generate_batches(4, 120):
        obs = batch[OBS][:, 0].numpy().reshape(-1, SEQ)
        for first, w in zip(batch[RHS][:, 0].tolist(), obs.tolist(), strict=True):
            t0, t1 = decode(w[0])[2], decode(w[-1])[2]
            if first % 1:  # a window of the second slice
                assert t0 >= 9, w
            else:
                assert t1 <= 11, w


def test_segments_bookkeeping() -> None:
    """Segments: starts at or below the oldest stored row are dropped, windows of other
    lanes (hindsight copies) cross nothing, and usable counts the windows per lane."""
    seg = Segments()
    seg.start(0, oldest=0)  # a first slice separates nothing
    assert seg.lengths(0, 10).tolist() == [10] and not seg.separate(0, 10)
    seg.start(10, oldest=0)
    assert seg.separate(0, 11) and not seg.separate(10, 20)
    seg.start(14, oldest=2)
    assert seg.lengths(2, 20).tolist() == [8, 4, 6]
    assert seg.usable(2, 20, width=6) == 3 + 0 + 1
    lanes, envs = 4, 2  # lanes 2 and 3: hindsight copies
    keys = np.array([8 * lanes, 8 * lanes + 1, 8 * lanes + 2, 4 * lanes, 14 * lanes + 3])
    assert seg.crossing(keys, lanes, envs, width=6).tolist() == [True, True, False, False,
                                                                  False]
    seg.start(30, oldest=12)  # 10 fell out of the ring
    assert seg.lengths(12, 40).tolist() == [2, 16, 10]
    seg.clear()
    assert seg.lengths(12, 40).tolist() == [28]


# ------------------------------------------------------------------ HER learners
Call = tuple[Key, Key, Key]  # a her_function call: (step, initial_state, final_state)
FEED_FORWARD = (None, None)  # actor, algorithm
RECURRENT = (ACTOR, ALGO)
#: The repro's pattern (each collector sends one sequence per export, strictly
#: interleaved) and one with exports of uneven lengths, episodes ending anywhere in them.
EVEN = [(0, SEQ), (1, SEQ)] * 4
UNEVEN = [(0, 9), (1, 7), (0, 11), (1, 8), (0, 6), (1, 12), (0, 9), (1, 9), (0, 8)]


def her_learner(actor: Any, algo: Any) -> tuple[HERBuffer, list[Call]]:
    """A HER learner whose her_function records each call (decoded) and gives the copy
    the reward ``final_state`` (the code of its episode's last step)."""
    calls: list[Call] = []

    def her(o: Any, rhs: Any, o2: Any, rhs2: Any, r: Any, initial_state: Any,
            final_state: Any) -> tuple[Any, Any, Any, Any, Any]:
        calls.append((decode(o[0, 0]), decode(initial_state[0, 0]),
                      decode(final_state[0, 0])))
        return o, rhs, o2, rhs2, np.full((1, 1), final_state[0, 0], np.float32)

    return HERBuffer(500, "cpu", actor, algo, None, her_function=her, seed=0), calls


def episode_of(key: Key) -> tuple[int, int, int]:
    """(collector, env, episode number) of an env step."""
    source, env, t = key
    return source, env, t // PERIOD[source]


def model_relabelled(sent: list[tuple[int, list[int]]], overlap: int) -> Counter[Call]:
    """Plain loop: the her_function calls a learner should make, by collector name. An
    export continues its collector's previous one when it re-sends that one's last
    ``overlap`` rows (then those are skipped) or starts at the next step; otherwise its
    collector's running episodes are dropped (a stream that starts after a gap
    relabels the rest of the episode it starts in). At each episode end every step of
    the running episode but the last is relabelled with the episode's first and last
    step."""
    streams: dict[int, list[int]] = {}  # per collector: the steps of its stream
    running: dict[tuple[int, int], list[int]] = {}  # per (collector, env): its episode
    out: Counter[Call] = Counter()
    for source, ts in sent:
        before = streams.get(source, [])
        if before and overlap and ts[:overlap] == before[-overlap:]:
            new = ts[overlap:]
        elif before and ts and ts[0] == before[-1] + 1:
            new = ts
        else:  # not a continuation: a new stream
            before, new = [], ts
            for env in range(ENVS):
                running[source, env] = []
        streams[source] = before + new
        for t in new:
            for env in range(ENVS):
                steps = running.setdefault((source, env), [])
                steps.append(t)
                if first_of_episode(source, t + 1):  # NextDone: the episode ends
                    for u in steps[:-1]:
                        out[(source, env, u), (source, env, steps[0]),
                            (source, env, steps[-1])] += 1
                    running[source, env] = []
    return out


def check_copies(learner: HERBuffer, mini_batch_size: int = 600) -> None:
    """The stored hindsight copies (reward >= 10000: their episode's last step) each
    belong to the episode of their step."""
    batch = next(learner.generate_batches(1, mini_batch_size))
    rew, obs = batch[REW][:, 0].tolist(), batch[OBS][:, 0].tolist()
    copies = [(decode(o), decode(r)) for o, r in zip(obs, rew, strict=True) if r >= 10000]
    assert copies and len(copies) < len(obs)
    for step, final in copies:
        assert episode_of(final) == episode_of(step), (step, final)
        assert final[2] % PERIOD[final[0]] == PERIOD[final[0]] - 1, final


@pytest.mark.parametrize("rounds", [EVEN, UNEVEN], ids=["even", "uneven"])
@pytest.mark.parametrize("actor, algo", [FEED_FORWARD, RECURRENT],
                         ids=["feed-forward", "recurrent"])
def test_her_learner_of_two_collectors_relabels_each_collectors_own_episodes(
        actor: Any, algo: Any, rounds: list[tuple[int, int]]) -> None:
    """Section 'HER' with pytorchrl's data transfer (get_all_buffer_data -> reset ->
    insert_data_slice) from two collectors, exports interleaved A, B, A, B, ...: every
    relabelled transition's step, initial_state and final_state are one collector's
    env's same episode (its first and last step), each step of every episode the
    learner received whole is relabelled once, and nothing else is (the learner glued
    one collector's running episode to the other's rows: 12 of 20 feed-forward and 7 of
    30 recurrent relabelled transitions mixed the collectors, and the recurrent learner
    relabelled the re-sent overlap rows again)."""
    learner, calls = her_learner(actor, algo)
    sent = collect(learner, rounds, actor=actor, algo=algo)
    assert len({source for source, _ in sent}) == 2
    for step, initial, final in calls:
        source, _, n = episode_of(step)
        assert episode_of(initial) == episode_of(final) == episode_of(step), \
            (step, initial, final)
        assert (initial[2], final[2]) == (n * PERIOD[source], (n + 1) * PERIOD[source] - 1)
    # what the episodes imply: every whole episode received, all its steps but the last
    received = {(source, env, t) for source, ts in sent for t in ts for env in range(ENVS)}
    whole: Counter[Call] = Counter()
    for source, env, t in received:
        n, period = t // PERIOD[source], PERIOD[source]
        episode = [(source, env, u) for u in range(n * period, (n + 1) * period)]
        if set(episode) <= received and (source, env, t) != episode[-1]:
            whole[(source, env, t), episode[0], episode[-1]] += 1
    assert Counter(calls) == whole
    assert Counter(calls) == model_relabelled(sent, OVERLAP if actor else 0)
    assert learner.relabelled == len(calls) == sum(whole.values()) > 0
    check_copies(learner)


def test_her_learner_of_the_repro() -> None:
    """The follow-up's repro, one env per collector and four rounds of four steps each
    from two collectors: 20 relabelled transitions feed-forward and 20 recurrent (two
    whole six-step episodes per collector), none mixing the collectors (there were 12 of
    20 and 7 of 30)."""
    def her(o: Any, rhs: Any, o2: Any, rhs2: Any, r: Any, initial_state: Any,
            final_state: Any) -> tuple[Any, Any, Any, Any, Any]:
        seen.append((int(o[0, 0]) // 1000, int(initial_state[0, 0]) // 1000,
                     int(final_state[0, 0]) // 1000))
        return o, rhs, o2, rhs2, r

    def step(c: int, t: int) -> dict[str, Any]:
        v = float(1000 * (c + 1) + t)
        return {OBS: torch.tensor([[v]]), RHS: torch.full((1, 2), v),
                DONE: torch.zeros(1, 1), ACT: torch.zeros(1, 1), REW: torch.zeros(1, 1),
                OBS2: torch.tensor([[v + 1]]), RHS2: torch.full((1, 2), v + 1),
                DONE2: torch.tensor([[float(t % 6 == 5)]])}

    for actor, algo in (FEED_FORWARD,
                        (ACTOR, SimpleNamespace(gamma=0.9, update_every=4))):
        seen: list[tuple[int, int, int]] = []
        learner = HERBuffer(200, "cpu", actor, algo, None, her_function=her, seed=0)
        cols = [ReplayBuffer(100, "cpu", actor, algo, None) for _ in range(2)]
        clock = [0, 0]
        for _ in range(4):
            for c, col in enumerate(cols):
                for _ in range(4):
                    col.insert_transition(step(c, clock[c]))
                    clock[c] += 1
                data = col.get_all_buffer_data(data_to_cpu=True)
                col.reset()
                learner.insert_data_slice(data)
        assert [s for s in seen if len(set(s)) > 1] == []
        assert len(seen) == learner.relabelled == 20
        assert Counter(s[0] for s in seen) == {1: 10, 2: 10}


@pytest.mark.parametrize("actor, algo", [FEED_FORWARD, RECURRENT],
                         ids=["feed-forward", "recurrent"])
def test_her_learner_of_one_collector_relabels_as_the_collector_would(
        actor: Any, algo: Any) -> None:
    """One collector (the usual flow): the learner relabels exactly what a HER storage
    that collected the steps itself relabels, in the same order."""
    learner, calls = her_learner(actor, algo)
    sent = collect(learner, [(0, 8), (0, 6), (0, 9), (0, 12), (0, 5)], actor=actor,
                   algo=algo)
    direct, direct_calls = her_learner(actor, algo)
    steps = sorted({t for _, ts in sent for t in ts})
    assert steps == list(range(len(steps)))
    for t in steps:
        direct.insert_transition(transition(0, t))
    assert calls == direct_calls and learner.relabelled == direct.relabelled > 0


@pytest.mark.parametrize("actor, algo", [FEED_FORWARD, RECURRENT],
                         ids=["feed-forward", "recurrent"])
def test_her_learner_does_not_glue_an_episode_across_a_gap(actor: Any, algo: Any) -> None:
    """A slice that does not continue a running episode (one collector whose exports
    lost rows between them: a recurrent one exporting with data_to_cpu=False, whose
    reset drops the rows held back, or a feed-forward one whose storage overwrote rows
    it had not exported) is not glued to it: the episode the gap cut is never relabelled
    and the next stream relabels the rest of the episode it starts in, with that
    stream's first step as initial_state."""
    learner, calls = her_learner(actor, algo)
    if actor is None:
        sent = collect(learner, [(0, 5)], actor=actor, algo=algo)
        lossy = ReplayBuffer(6, "cpu", actor, algo, None)  # keeps the newest 6 of 11 steps
        for t in range(5, 16):
            lossy.insert_transition(transition(0, t))
        data = lossy.get_all_buffer_data()
        sent.append((0, [decode(v)[2] for v in data[OBS][:, 0, 0].tolist()]))
        learner.insert_data_slice(data)
        assert [ts for _, ts in sent] == [[0, 1, 2, 3, 4], [10, 11, 12, 13, 14, 15]]
    else:
        sent = collect(learner, [(0, 8), (0, 8), (0, 10), (0, 7)], data_to_cpu=False,
                       actor=actor, algo=algo)
        assert [ts[0] for _, ts in sent] == [0, 8, 16, 26]
    for step, initial, final in calls:
        assert episode_of(initial) == episode_of(final) == episode_of(step)
        gap = next(ts for _, ts in sent if step[2] in ts)
        assert initial[2] in gap and final[2] in gap, (step, initial, final)
    assert Counter(calls) == model_relabelled(sent, OVERLAP if actor else 0)
    assert learner.relabelled == len(calls) > 0


def test_streams_bookkeeping() -> None:
    """Streams: the newest written first; a stream whose newest row left the storage is
    forgotten, one with no running episode too unless its rows may be re-sent
    (recurrent), and at most MAX_STREAMS are kept (the least recently written goes)."""
    def stream(running: bool) -> Stream:
        s = Stream.new(envs=2)
        if running:
            s.episodes[1].append({"obs": 0})
        return s

    for keep_finished in (False, True):
        streams = Streams(keep_finished=keep_finished)
        a, b, done = stream(True), stream(True), stream(False)
        streams.wrote(a, oldest=0, end=4)
        streams.wrote(b, oldest=0, end=8)
        assert streams.newest_first() == [b, a] and streams.at(8) is b and streams.at(4) is None
        streams.wrote(done, oldest=0, end=12)
        assert streams.newest_first() == ([done, b, a] if keep_finished else [b, a])
        streams.wrote(a, oldest=8, end=16)  # rows 0-7 overwritten: b's newest row is gone
        assert streams.newest_first() == ([a, done] if keep_finished else [a])
        many = [stream(True) for _ in range(MAX_STREAMS + 3)]
        for i, s in enumerate(many):
            streams.wrote(s, oldest=8, end=20 + i)
        assert streams.newest_first() == many[::-1][:MAX_STREAMS]
        streams.clear()
        assert streams.newest_first() == [] and streams.at(20 + len(many) - 1) is None
