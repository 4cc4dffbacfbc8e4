"""The pytorchrl front end, section by section of pytorchrl's off-policy storage docs
(reference 003): Replay buffer, N-Step Replay Buffer, Prioritized Experience Replay
Buffer, Emphasizing Recent Experience Replay Buffer (ERE), Hindsight experience replay
buffer (HER); plus a pytorchrl-style PER + n-step DQN loop on CartPole-v1."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybank.compat.pytorchrl as prl_storages  # noqa: E402
from replaybank.compat.pytorchrl import (  # noqa: E402
    EREBuffer,
    HERBuffer,
    NStepReplayBuffer,
    PERBuffer,
    ReplayBuffer,
)
from replaybank.errors import (  # noqa: E402
    ArgumentError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ReplayBankError,
    ShapeError,
    SpecError,
)

OBS, RHS, DONE, ACT, REW = ("Observation", "RecurrentHiddenStates", "Done", "Action",
                            "Reward")
IREW, OBS2, RHS2, DONE2, ACTPROBS = ("IntrinsicReward", "NextObservation",
                                     "NextRecurrentHiddenStates", "NextDone", "ActionProbs")
DOC_TENSORS = (OBS, RHS, DONE, ACT, REW, IREW, OBS2, RHS2, DONE2, ACTPROBS)
ALGO = SimpleNamespace(gamma=0.9, update_every=4)
ACTOR = SimpleNamespace(is_recurrent=False)
ITERS = 30


def transition(t: int, n: int = 2, done2: Any = None, obs_dim: int = 3) -> dict[str, Any]:
    """pytorchrl's transition dict at step t of n envs: obs = [t, env, 0...]."""
    obs = torch.zeros(n, obs_dim)
    obs[:, 0] = t
    obs[:, 1] = torch.arange(n)
    nxt = obs.clone()
    nxt[:, 0] = t + 1
    d2 = torch.zeros(n, 1) if done2 is None else torch.as_tensor(done2, dtype=torch.float32
                                                                 ).reshape(n, 1)
    return {OBS: obs, RHS: torch.zeros(n, 2), DONE: torch.zeros(n, 1),
            ACT: torch.full((n, 1), float(t % 2)), REW: torch.full((n, 1), float(t)),
            OBS2: nxt, RHS2: torch.zeros(n, 2), DONE2: d2, "EnvironmentInformation": {}}


def fill(buf: Any, steps: int, n: int = 2, ends: dict[int, list[int]] | None = None) -> None:
    for t in range(steps):
        done2 = None
        if ends is not None:
            done2 = [float(t in ends.get(e, [])) for e in range(n)]
        buf.insert_transition(transition(t, n, done2))


# ------------------------------------------------------------------ Replay buffer
def test_replay_buffer_constructor_and_factory() -> None:
    """Section 'Replay buffer': ReplayBuffer(size, device, actor, algorithm, envs) and
    create_factory(size) -> func(device, actor, algorithm, envs)."""
    buf = ReplayBuffer(50, "cpu", ACTOR, ALGO, None)
    assert buf.max_size == 50 and buf.size == 0 and buf.step == 0
    assert buf.device == "cpu" and buf.actor is ACTOR and buf.algo is ALGO
    make = ReplayBuffer.create_factory(size=20)
    made = make("cpu", ACTOR, ALGO, None)
    assert isinstance(made, ReplayBuffer) and made.max_size == 20
    with pytest.raises(ConfigError):
        ReplayBuffer(0, "cpu", ACTOR, ALGO, None)


def test_storage_tensors_documented_names() -> None:
    """Section 'Replay buffer' (and every class): storage_tensors = the documented tuple."""
    for cls in (ReplayBuffer, NStepReplayBuffer, PERBuffer, EREBuffer, HERBuffer):
        assert cls.storage_tensors == DOC_TENSORS
    assert prl_storages.STORAGE_TENSORS == DOC_TENSORS


def test_bases_as_documented() -> None:
    """Every section's 'Bases:' line: the documented hierarchy."""
    assert issubclass(NStepReplayBuffer, ReplayBuffer)
    assert issubclass(PERBuffer, NStepReplayBuffer)
    assert issubclass(EREBuffer, PERBuffer)
    assert issubclass(HERBuffer, EREBuffer)


def test_init_tensors_and_insert_transition_shapes() -> None:
    """Section 'Replay buffer': init_tensors(sample) (lazy, from a sample) and
    insert_transition(sample) with [num_envs, ...] values; keys outside storage_tensors
    are ignored."""
    buf = ReplayBuffer(10, "cpu", ACTOR, ALGO, None)
    buf.init_tensors(transition(0, n=3))
    assert buf.num_envs == 3 and buf.size == 0
    fill(buf, 4, n=3)
    assert (buf.size, buf.step) == (4, 4)
    data = buf.get_all_buffer_data()
    assert data[OBS].shape == (4, 3, 3) and data[REW].shape == (4, 3, 1)
    assert data[DONE2].shape == (4, 3, 1) and data[ACT].shape == (4, 3, 1)
    assert data[OBS].dtype == np.float32
    assert data[IREW] is None and data[ACTPROBS] is None  # not in the samples
    np.testing.assert_array_equal(data[OBS2][:, :, 0], data[OBS][:, :, 0] + 1)
    with pytest.raises(ValueError, match="lacks"):
        ReplayBuffer(10, "cpu", ACTOR, ALGO, None).init_tensors({OBS: torch.zeros(1, 2)})


def test_ring_keeps_max_size_rows() -> None:
    """Section 'Replay buffer': size = storage capacity along the time axis."""
    buf = ReplayBuffer(5, "cpu", ACTOR, ALGO, None)
    fill(buf, 12)
    assert buf.size == 5
    data = buf.data
    assert data[OBS][:, 0, 0].tolist() == [7, 8, 9, 10, 11]


def test_generate_batches_shapes_keys_and_count() -> None:
    """Section 'Replay buffer': generate_batches(num_mini_batch, mini_batch_size,
    num_epochs=1) yields num_mini_batch dicts of float32 tensors [B, ...]; the hidden
    states of a feed-forward actor are one zero row, as pytorchrl's."""
    buf = ReplayBuffer(100, "cpu", ACTOR, ALGO, None, seed=0)
    fill(buf, 30)
    batches = list(buf.generate_batches(3, 16))
    assert len(batches) == 3
    b = batches[0]
    assert set(b) == set(DOC_TENSORS)
    assert b[OBS].shape == (16, 3) and b[OBS2].shape == (16, 3)
    assert b[ACT].shape == (16, 1) and b[REW].shape == (16, 1) and b[DONE2].shape == (16, 1)
    assert b[DONE].shape == (16, 1)
    assert b[RHS].shape == (1, 2) and not b[RHS].any()
    assert b[IREW] == {} and b[ACTPROBS] == {}
    assert all(v.dtype == torch.float32 for v in b.values() if isinstance(v, torch.Tensor))
    assert torch.all(b[OBS2][:, 0] == b[OBS][:, 0] + 1)
    assert torch.all(b[REW][:, 0] == b[OBS][:, 0])  # reward t at obs t
    assert "n_step" not in b  # the plain buffer adds no scheme keys
    assert len(list(buf.generate_batches(2, 4, num_epochs=5))) == 10  # 2 per epoch
    with pytest.raises(EmptyBufferError):
        next(ReplayBuffer(10, "cpu", ACTOR, ALGO, None).generate_batches(1, 4))


def test_dict_observations() -> None:
    """Section 'Replay buffer' (init_tensors): dict observations are stored and batched
    as dicts of tensors."""
    buf = ReplayBuffer(20, "cpu", ACTOR, ALGO, None, seed=0)
    for t in range(5):
        s = transition(t)
        s[OBS] = {"pos": s[OBS], "goal": torch.ones(2, 1)}
        s[OBS2] = {"pos": s[OBS2], "goal": torch.ones(2, 1)}
        buf.insert_transition(s)
    b = next(buf.generate_batches(1, 8))
    assert set(b[OBS]) == {"pos", "goal"} and b[OBS]["pos"].shape == (8, 3)
    assert torch.all(b[OBS2]["pos"][:, 0] == b[OBS]["pos"][:, 0] + 1)
    assert buf.get_all_buffer_data()[OBS2]["goal"].shape == (5, 2, 1)


def test_before_after_gradients_hooks() -> None:
    """Section 'Replay buffer': before_gradients() and after_gradients(batch, info) ->
    info."""
    buf = ReplayBuffer(10, "cpu", ACTOR, ALGO, None)
    fill(buf, 3)
    assert buf.before_gradients() is None
    info = {"Algorithm": {}}
    assert buf.after_gradients(next(buf.generate_batches(1, 2)), info) is info


def test_get_all_buffer_data_reset_and_reinsert() -> None:
    """Section 'Replay buffer': get_all_buffer_data, reset, insert_data_slice. A
    collector exports the rows added since its last reset and resets (size and step to
    zero, as documented); a learner's storage receives the rows."""
    col = ReplayBuffer(100, "cpu", ACTOR, ALGO, None, seed=0)
    learner = ReplayBuffer(100, "cpu", ACTOR, ALGO, None, seed=1)
    fill(col, 6)
    data = col.get_all_buffer_data(data_to_cpu=True)
    assert data[OBS].shape[0] == 6
    col.reset()
    assert col.step == 0 and col.size == 0
    learner.insert_data_slice(data)
    assert (learner.size, learner.step) == (6, 6)
    np.testing.assert_array_equal(learner.data[OBS], data[OBS])
    np.testing.assert_array_equal(learner.data[OBS2], data[OBS2])
    # next collection: only new rows are exported after a reset
    for t in range(6, 9):
        col.insert_transition(transition(t))
    new = col.get_all_buffer_data()
    assert new[OBS][:, 0, 0].tolist() == [6, 7, 8]
    learner.insert_data_slice(new)
    assert learner.data[OBS][:, 0, 0].tolist() == list(range(9))
    # a storage that re-inserts its own export after its reset holds it once
    col.reset()
    col.insert_data_slice(new)
    assert (col.size, col.step) == (3, 3)
    assert col.data[OBS][:, 0, 0].tolist() == [6, 7, 8]
    with pytest.raises(ValueError, match="different lengths"):
        learner.insert_data_slice({OBS: np.zeros((2, 2, 3)), ACT: np.zeros((3, 2, 1))})


def test_feed_forward_hidden_states_transfer_as_one_zero_row() -> None:
    """Section 'Replay buffer' (feed-forward actor): pytorchrl keeps one zero row of the
    hidden states. get_all_buffer_data, get_data_slice and data export it ([1, num_envs,
    ...], as pytorchrl's data[RHS][:idx]) and a learner filled with insert_data_slice
    yields the same zero row in its batches as the collector (the export held None and
    the learner's batches {})."""
    make = ReplayBuffer.create_factory(10)
    col, learner = make("cpu", ACTOR, ALGO, None), make("cpu", ACTOR, ALGO, None)
    fill(col, 4)
    data = col.get_all_buffer_data(data_to_cpu=True)
    for key in (RHS, RHS2):
        assert data[key].shape == (1, 2, 2) and data[key].dtype == np.float32
        assert not data[key].any()
        assert col.data[key].shape == (1, 2, 2)
        assert col.get_data_slice(1, 3)[key].shape == (1, 2, 2)
        assert col.get_data_slice(3, 3)[key].shape == (0, 2, 2)  # no rows, no zero row
    col.reset()
    learner.insert_data_slice(data)
    assert (learner.size, learner.step) == (4, 4)
    fill(col, 4)
    a, b = next(col.generate_batches(1, 3)), next(learner.generate_batches(1, 3))
    for key in (RHS, RHS2):
        assert isinstance(b[key], torch.Tensor) and b[key].shape == a[key].shape == (1, 2)
        assert not b[key].any()
    again = learner.get_all_buffer_data()
    assert {k: None if v is None else v.shape for k, v in again.items()} == \
        {k: None if v is None else v.shape for k, v in data.items()}
    her = HERBuffer(10, "cpu", ACTOR, ALGO, None)
    fill(her, 3)
    assert her.copy_single_tensor(RHS, 2).tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_reset_sets_size_and_step_to_zero() -> None:
    """Section 'Replay buffer': reset() "Set class size and step to zero": the old rows
    are not sampled any more (issue 14: size stayed and old rows were still drawn)."""
    buf = ReplayBuffer(100, "cpu", ACTOR, ALGO, None, seed=0)
    fill(buf, 6)
    buf.reset()
    assert (buf.size, buf.step) == (0, 0)
    assert buf.get_all_buffer_data()[OBS].shape[0] == 0
    with pytest.raises(EmptyBufferError):
        buf.generate_batches(1, 4)
    for t in range(100, 103):
        buf.insert_transition(transition(t))
    assert (buf.size, buf.step) == (3, 3)
    b = next(buf.generate_batches(1, 256))
    assert set(b[OBS][:, 0].tolist()) == {100.0, 101.0, 102.0}  # none of the old rows
    per = PERBuffer(50, "cpu", ACTOR, ALGO, None, alpha=0.6, seed=0)
    fill(per, 5)
    per.reset()
    assert per.size == 0
    fill(per, 2)
    assert set(next(per.generate_batches(1, 64))[OBS][:, 0].tolist()) == {0.0, 1.0}


def test_get_data_slice_positions() -> None:
    """Section 'Replay buffer': get_data_slice(start_pos, end_pos) copies rows; positions
    count from the first row added since the last reset (the oldest row stored)."""
    buf = ReplayBuffer(100, "cpu", ACTOR, ALGO, None)
    fill(buf, 5)
    buf.reset()
    for t in range(5, 8):
        buf.insert_transition(transition(t))
    assert buf.get_data_slice(0, 2)[OBS][:, 0, 0].tolist() == [5, 6]
    assert buf.get_data_slice(-2, 1)[OBS][:, 0, 0].tolist() == [5]  # nothing older
    sl = buf.get_data_slice(0, 1)
    sl[OBS][:] = -1  # a copy
    assert buf.get_data_slice(0, 1)[OBS][0, 0, 0] == 5
    ring = ReplayBuffer(4, "cpu", ACTOR, ALGO, None)
    fill(ring, 7)  # holds 3..6
    assert ring.get_data_slice(0, 4)[OBS][:, 0, 0].tolist() == [3, 4, 5, 6]


def test_insert_single_tensor_slice() -> None:
    """Section 'Replay buffer': insert_single_tensor_slice(tensor_storage, tensor_key,
    tensor_values) -> length; allocates [max_size, ...] float32, writes circularly."""
    buf = ReplayBuffer(4, "cpu", ACTOR, ALGO, None)
    store: dict[str, Any] = {"x": None}
    assert buf.insert_single_tensor_slice(store, "x", np.ones((3, 2, 5))) == 3
    assert store["x"].shape == (4, 2, 5) and store["x"].dtype == np.float32
    fill(buf, 3)  # step 3: the next slice wraps
    assert buf.insert_single_tensor_slice(store, "x", torch.full((2, 2, 5), 7.0)) == 2
    assert store["x"][:, 0, 0].tolist() == [7, 1, 1, 7]


def test_update_storage_parameter() -> None:
    """Section 'Replay buffer': update_storage_parameter(name, value) changes an existing
    attribute, ignores unknown names; max_size of an empty storage rebuilds it."""
    buf = ReplayBuffer(10, "cpu", ACTOR, ALGO, None)
    buf.update_storage_parameter("no_such_attribute", 3)
    assert not hasattr(buf, "no_such_attribute")
    buf.update_storage_parameter("max_size", 6)
    fill(buf, 9)
    assert buf.size == 6 and buf.buffer is not None and buf.buffer.capacity == 12
    with pytest.raises(ConfigError, match="max_size"):
        buf.update_storage_parameter("max_size", 8)


@pytest.mark.parametrize("name, value", [
    ("size", 3), ("step", 0), ("num_envs", 3), ("data", {}), ("buffer", None),
    ("recurrent_actor", True), ("sequence_length", 4), ("actor", None), ("seed", 1),
    ("storage_tensors", ()), ("prioritized", False), ("initial_eta", 0.5),
    ("relabelled", 0), ("staged_overlap", None), ("_fresh", 0), ("reset", None)])
def test_update_storage_parameter_refuses_what_cannot_change(name: str, value: Any) -> None:
    """Section 'Replay buffer': update_storage_parameter(parameter_name, value) - "If
    parameter_name is an attribute ..., change its value". Attributes that are the
    storage's state or fixed at construction are refused, naming the parameter and why,
    and the storage is unchanged (size, num_envs and data raised AttributeError;
    ('buffer', None) silently dropped every row; ('recurrent_actor', True) broke the
    next generate_batches)."""
    buf = HERBuffer(20, "cpu", ACTOR, ALGO, None, her_function=goal_her, seed=0)
    fill(buf, 6, ends={0: [2]})
    if name == "sequence_length":
        buf.sequence_length = 4  # a recurrent storage's attribute: give it one
    msg = rejects(buf, lambda b: b.update_storage_parameter(name, value), ConfigError)
    assert f"update_storage_parameter({name!r}" in msg and "cannot change" in msg
    assert "'n_step'" in msg and "'her_function'" in msg  # what can
    b = next(buf.generate_batches(1, 8))
    assert b[OBS].shape == (8, 3) and buf.size == 6


def test_update_storage_parameter_changes_the_parameters_algorithms_update() -> None:
    """Section 'Replay buffer': the parameters pytorchrl's schemes read while training
    (max_size, gamma, device; n_step; epsilon, alpha, beta, default_error; eta, cmin;
    her_function) change, checked as the constructors check them; names that are no
    attribute are ignored, as in pytorchrl."""
    buf = HERBuffer(200, "cpu", ACTOR, ALGO, None, her_function=goal_her, alpha=0.5,
                    seed=0)
    fill(buf, 12, ends={0: [5]})
    new = {"gamma": 0.5, "n_step": 2, "epsilon": 0.1, "alpha": 0.7, "beta": 0.3,
           "default_error": 9.0, "eta": 0.9, "cmin": 7, "her_function": her_fn,
           "device": "cpu"}
    for name, value in new.items():
        buf.update_storage_parameter(name, value)
        assert getattr(buf, name) == value
    assert next(buf.generate_batches(1, 8))["n_step"].shape == (8, 1)
    buf.update_storage_parameter("not_an_attribute", 1)
    assert not hasattr(buf, "not_an_attribute")
    rejects(buf, lambda b: b.update_storage_parameter("her_function", 5), ArgumentError)
    plain = ReplayBuffer(10, "cpu", ACTOR, ALGO, None)  # no n-step discounts in batches
    msg = rejects(plain, lambda b: b.update_storage_parameter("n_step", 3), ConfigError)
    assert "NStepReplayBuffer" in msg


def test_recurrent_batches_and_reset_keeps_overlap() -> None:
    """Section 'Replay buffer' (recurrent actor): sequences of update_every steps,
    hidden states at each sequence start, get_all_buffer_data of whole sequences and a
    reset that keeps the overlap slice."""
    actor = SimpleNamespace(is_recurrent=True, sequence_overlap=0.5)
    algo = SimpleNamespace(gamma=0.9, update_every=4)
    buf = ReplayBuffer(100, "cpu", actor, algo, None, seed=0)
    assert (buf.sequence_length, buf.overlap_length, buf.non_overlap_length) == (4, 2, 2)
    for t in range(10):
        s = transition(t)
        s[RHS] = torch.full((2, 2), float(t))
        s[RHS2] = torch.full((2, 2), float(t + 1))
        buf.insert_transition(s)
    b = next(buf.generate_batches(1, 8))  # 8 // 4 + 1 = 3 sequences
    assert b[OBS].shape == (12, 3) and b[RHS].shape == (3, 2) and b[RHS2].shape == (3, 2)
    starts = b[OBS][::4, 0]
    assert torch.all(b[RHS][:, 0] == starts)  # the hidden state of each window's start
    seq = b[OBS][:, 0].reshape(3, 4)
    assert torch.all(seq[:, 1:] - seq[:, :-1] == 1)
    data = buf.get_all_buffer_data(data_to_cpu=True)  # whole sequences only: 8 of 10
    assert data[OBS].shape[0] == 8
    assert buf.staged_overlap is not None
    assert buf.staged_overlap[OBS][:, 0, 0].tolist() == [6, 7, 8, 9]
    buf.reset()
    assert buf.step == 4  # overlap 6, 7 and held-back 8, 9 lead the next export
    buf.insert_transition(transition(10))
    assert buf.get_data_slice(0, 5)[OBS][:, 0, 0].tolist() == [6, 7, 8, 9, 10]


# ------------------------------------------------------------------ N-Step
def nstep_oracle(rewards: list[float], ends: list[bool], t: int, n: int,
                 gamma: float) -> tuple[float, int, bool]:
    """Plain loop: return, window length and done of step t (stops at an episode end
    and at the newest step)."""
    g, k = 0.0, 0
    while k < n and t + k < len(rewards):
        g += gamma ** k * rewards[t + k]
        k += 1
        if ends[t + k - 1]:
            break
    return g, k, ends[t + k - 1]


def test_nstep_returns_against_plain_loop() -> None:
    """Section 'N-Step Replay Buffer': truncated n-step returns (gamma from the
    algorithm), NextObservation n steps ahead, NextDone of the window's last step and
    batch['n_step'] (each row's window length: gamma ** n_step is its discount)."""
    n, gamma = 3, 0.9
    buf = NStepReplayBuffer(200, "cpu", ACTOR, SimpleNamespace(gamma=gamma), None, n_step=n,
                            seed=0)
    assert buf.n_step == n and buf.gamma == gamma
    ends0 = {4, 9, 10, 17}
    fill(buf, 20, n=1, ends={0: sorted(ends0)})
    rewards = [float(t) for t in range(20)]
    ends = [t in ends0 for t in range(20)]
    b = next(buf.generate_batches(1, 256))
    for i in range(256):
        t = int(b[OBS][i, 0])
        g, k, done = nstep_oracle(rewards, ends, t, n, gamma)
        assert b[REW][i, 0].item() == pytest.approx(g, rel=1e-6)
        assert b["n_step"][i, 0].item() == k
        assert b[OBS2][i, 0].item() == t + k
        assert b[DONE2][i, 0].item() == float(done)


def test_nstep_factory_and_defaults() -> None:
    """Section 'N-Step Replay Buffer': create_factory(size, n_step=1); n_step 1 gives
    batch['n_step'] == 1."""
    make = NStepReplayBuffer.create_factory(30)
    buf = make("cpu", ACTOR, ALGO, None)
    assert buf.n_step == 1
    fill(buf, 5)
    assert next(buf.generate_batches(1, 4))["n_step"] == 1
    with pytest.raises(ConfigError):
        NStepReplayBuffer(10, "cpu", ACTOR, ALGO, None, n_step=0)


def test_nstep_update_storage_parameter() -> None:
    """Section 'N-Step Replay Buffer': update_storage_parameter('n_step', k) applies to the
    next batches (returns are computed at sample time)."""
    buf = NStepReplayBuffer(50, "cpu", ACTOR, ALGO, None, n_step=1, seed=0)
    fill(buf, 20, n=1)
    buf.update_storage_parameter("n_step", 2)
    b = next(buf.generate_batches(1, 64))
    full = b["n_step"][:, 0] == 2
    assert full.any()
    assert torch.allclose(b[REW][full, 0], b[OBS][full, 0] * 1.9 + 0.9)


# ------------------------------------------------------------------ PER
def test_per_defaults_and_factory() -> None:
    """Section 'Prioritized Experience Replay Buffer': defaults n_step=1, epsilon=0.0,
    alpha=0.0, beta=1.0, default_error=1000000; create_factory with the same."""
    buf = PERBuffer.create_factory(10)("cpu", ACTOR, ALGO, None)
    assert (buf.n_step, buf.epsilon, buf.alpha, buf.beta, buf.default_error) == \
        (1, 0.0, 0.0, 1.0, 1000000)
    fill(buf, 5)
    buf.before_gradients()
    b = next(buf.generate_batches(1, 4))
    assert b["per_weights"] == 1.0 and b["n_step"] == 1 and len(b["idxs"]) == 4
    info = {"Algorithm": {}}  # alpha 0: no TD errors needed
    assert buf.after_gradients(b, info) is info
    with pytest.raises(ConfigError):  # the core's check of PER parameters
        PERBuffer(10, "cpu", ACTOR, ALGO, None, alpha=0.5, beta=2.0)


def test_get_priority_and_sequence_priority() -> None:
    """Section 'Prioritized Experience Replay Buffer': get_priority(error) =
    (error + epsilon) ** alpha; get_sequence_priority(sequence_data, eta=0.9)."""
    buf = PERBuffer(10, "cpu", ACTOR, ALGO, None, epsilon=0.5, alpha=0.7)
    err = np.array([0.0, 1.0, 3.5])
    np.testing.assert_allclose(buf.get_priority(err), (err + 0.5) ** 0.7)
    np.testing.assert_allclose(buf.get_priority(torch.tensor(err)), (err + 0.5) ** 0.7)
    seq = np.array([[1.0, 4.0], [3.0, 0.0], [2.0, 2.0]])
    np.testing.assert_allclose(buf.get_sequence_priority(seq),
                               0.9 * seq.max(0) + 0.1 * seq.mean(0))
    np.testing.assert_allclose(buf.get_sequence_priority(seq, eta=0.5),
                               0.5 * seq.max(0) + 0.5 * seq.mean(0))


def test_per_weights_and_priorities_against_plain_loop() -> None:
    """Section 'Prioritized Experience Replay Buffer': after_gradients sets priorities
    (error + epsilon) ** alpha from info['Algorithm']['errors']; per_weights [B, 1] =
    (N P(i)) ** -beta / max over the buffer; new steps get default_error."""
    eps, alpha, beta = 0.01, 0.6, 0.4
    buf = PERBuffer(40, "cpu", ACTOR, ALGO, None, epsilon=eps, alpha=alpha, beta=beta,
                    default_error=5.0, seed=0)
    fill(buf, 10)
    n = 20
    prio = {}  # item key -> priority, a plain-loop oracle
    b = next(buf.generate_batches(1, 64))
    keys = b["idxs"].copy()
    errors = torch.rand(64, 1) * 3
    for k, e in zip(keys.tolist(), errors[:, 0].tolist(), strict=True):
        prio[k] = (e + eps) ** alpha  # the last update of a repeated key wins
    buf.after_gradients(b, {"Algorithm": {"errors": errors}})
    assert "idxs" not in b
    for k in range(n):
        prio.setdefault(k, (5.0 + eps) ** alpha)
    b = next(buf.generate_batches(1, 256))
    total = sum(prio.values())
    p_min = min(prio.values())
    for i, k in enumerate(b["idxs"].tolist()):
        w = (n * prio[k] / total) ** -beta / (n * p_min / total) ** -beta
        assert b["per_weights"][i, 0].item() == pytest.approx(w, rel=1e-4)
    assert b["per_weights"].shape == (256, 1)
    with pytest.raises(ArgumentError, match="errors"):
        buf.after_gradients(b, {"Algorithm": {}})


def test_per_after_gradients_ragged_errors_or_idxs_name_the_argument() -> None:
    """Ragged lists were a ShapeError that named neither argument and suggested a dict for
    a gymnasium Tuple space; they name info['Algorithm']['errors'] or batch['idxs'] and
    the fix, and change nothing (the batch keeps its 'idxs')."""
    buf = PERBuffer(40, "cpu", ACTOR, ALGO, None, alpha=0.6, seed=0)
    fill(buf, 10)
    b = next(buf.generate_batches(1, 2))
    before = buf._core().sampler.state_dict()["priorities"].copy()
    with pytest.raises(ShapeError, match=r"^PERBuffer\.after_gradients: info\['Algorithm'\]"
                       r"\['errors'\]=\[\[1\.0\], \[1\.0, 2\.0\]\]: a ragged nest, rows of "
                       r"different lengths \(\[1\] has shape \(2,\) but \[0\] has shape "
                       r"\(1,\)\)"):
        buf.after_gradients(b, {"Algorithm": {"errors": [[1.0], [1.0, 2.0]]}})
    assert "idxs" in b
    ragged = {**b, "idxs": [[0], [1, 2]]}
    with pytest.raises(ShapeError, match=r"^PERBuffer\.after_gradients: batch\['idxs'\]="
                       r"\[\[0\], \[1, 2\]\]: a ragged nest, rows of different lengths "
                       r"\(\[1\] has shape \(2,\) but \[0\] has shape \(1,\)\); expected the "
                       r"integer item keys \[B\]"):
        buf.after_gradients(ragged, {"Algorithm": {"errors": [[1.0], [2.0]]}})
    assert np.array_equal(buf._core().sampler.state_dict()["priorities"], before)


def test_per_sampling_follows_priorities() -> None:
    """Section 'Prioritized Experience Replay Buffer': draws follow the priorities."""
    buf = PERBuffer(20, "cpu", ACTOR, ALGO, None, alpha=1.0, epsilon=0.0, seed=0)
    fill(buf, 10, n=1)
    b = next(buf.generate_batches(1, 10))
    idx = np.arange(10)
    b["idxs"] = idx
    errors = torch.zeros(10, 1)
    errors[3] = 1.0
    buf.after_gradients(b, {"Algorithm": {"errors": errors}})
    b = next(buf.generate_batches(1, 200))
    assert set(b["idxs"].tolist()) == {3}


# ------------------------------------------------------------------ ERE
def test_ere_defaults_factory_and_batch_info() -> None:
    """Section 'Emphasizing Recent Experience Replay Buffer (ERE)': defaults eta=1.0,
    cmin=5000; batches carry 'n_step', 'idxs' and 'ck' (the window), 'per_weights' only
    with PER."""
    buf = EREBuffer.create_factory(100)("cpu", ACTOR, ALGO, None)
    assert (buf.eta, buf.cmin, buf.alpha, buf.n_step) == (1.0, 5000, 0.0, 1)
    fill(buf, 10)
    b = next(buf.generate_batches(1, 4))
    assert b["ck"] == 20 and "per_weights" not in b and b["n_step"] == 1
    assert buf.after_gradients(b, {"Algorithm": {}}) == {"Algorithm": {}}


def test_ere_windows_emphasize_recent_steps() -> None:
    """Section 'ERE': mini batch k of K draws from the newest
    ck = max(N * eta ** (1000 k / K), cmin) steps."""
    buf = EREBuffer(500, "cpu", ACTOR, ALGO, None, eta=0.99, cmin=20, seed=0)
    fill(buf, 400, n=1)
    batches = list(buf.generate_batches(4, 128))
    for k, b in enumerate(batches):
        ck = max(int(400 * 0.99 ** (1000 * k / 4)), 20)
        assert b["ck"] == min(ck, 400)
        assert b[OBS][:, 0].min().item() >= 400 - b["ck"]


def test_ere_with_per() -> None:
    """Section 'ERE': combined with PER (alpha > 0) batches carry per_weights and
    after_gradients updates priorities."""
    buf = EREBuffer(200, "cpu", ACTOR, ALGO, None, alpha=0.6, beta=0.4, epsilon=1e-3,
                    eta=0.9, cmin=10, seed=0)
    fill(buf, 50)
    b = next(buf.generate_batches(2, 16))
    assert b["per_weights"].shape == (16, 1)
    buf.after_gradients(b, {"Algorithm": {"errors": torch.ones(16, 1)}})
    assert "idxs" not in b and "ck" not in b


def test_update_eta() -> None:
    """Section 'ERE': update_eta(info) adjusts eta from info['Episodes']['TrainReward']:
    fast progress emphasises recent data, a plateau returns to 1."""
    buf = EREBuffer(100, "cpu", ACTOR, ALGO, None, eta=0.95, cmin=10)
    fill(buf, 5)
    info: dict[str, Any] = {"Algorithm": {}}
    for r in range(10):
        info = buf.update_eta({"Algorithm": {}, "Episodes": {"TrainReward": float(r)}})
    assert info["Algorithm"]["eta"] == pytest.approx(0.95)
    assert buf.eta == pytest.approx(0.95)
    for _ in range(20):
        info = buf.update_eta({"Algorithm": {}, "Episodes": {"TrainReward": 9.0}})
    assert buf.eta == pytest.approx(1.0)
    assert buf.buffer is not None and buf.buffer.sampler.eta == pytest.approx(1.0)
    assert buf.update_eta({}) == {"Algorithm": {"eta": buf.eta}}


# ------------------------------------------------------------------ HER
def goal_her(o: Any, rhs: Any, o2: Any, rhs2: Any, r: Any, initial_state: Any,
             final_state: Any) -> tuple[Any, Any, Any, Any, Any]:
    """obs = [position, env, goal]: the goal becomes the episode's final position."""
    goal = final_state[:, 0]
    o, o2 = o.copy(), o2.copy()
    o[:, 2] = goal
    o2[:, 2] = goal
    return o, rhs, o2, rhs2, (o2[:, 0] == goal).astype(np.float32)[:, None]


def test_her_defaults_factory_and_identity() -> None:
    """Section 'Hindsight experience replay buffer (HER)': create_factory(size,
    her_function=identity, n_step=1, ...); the default her_function stores copies."""
    buf = HERBuffer.create_factory(50)("cpu", ACTOR, ALGO, None)
    assert (buf.n_step, buf.eta, buf.cmin, buf.alpha) == (1, 1.0, 5000, 0.0)
    fill(buf, 6, n=1, ends={0: [5]})
    assert buf.relabelled == 5  # every step of the episode but the last
    assert len(buf.buffer) == 11


def test_her_two_envs_different_lengths() -> None:
    """Section 'HER' (its warning lifted): with 2 envs whose episodes have different
    lengths, each env's episode is relabelled when it ends, with its own initial and
    final states."""
    buf = HERBuffer(200, "cpu", ACTOR, ALGO, None, her_function=goal_her, seed=0)
    lengths = [3, 5]
    pos = [0, 0]
    for t in range(30):
        obs = torch.zeros(2, 3)
        nxt = torch.zeros(2, 3)
        ends = []
        for e, n in enumerate(lengths):
            obs[e] = torch.tensor([pos[e], e, 99.0])
            nxt[e] = torch.tensor([pos[e] + 1, e, 99.0])
            ends.append(float(t % n == n - 1))
            pos[e] = 0 if ends[-1] else pos[e] + 1
        buf.insert_transition({OBS: obs, ACT: torch.zeros(2, 1), REW: torch.zeros(2, 1),
                               OBS2: nxt, DONE: torch.zeros(2, 1),
                               DONE2: torch.tensor(ends)[:, None]})
    # env 0: 10 episodes x 2 copies, env 1: 6 episodes x 4 copies
    assert buf.relabelled == 10 * 2 + 6 * 4
    b = next(buf.generate_batches(1, 2000))
    her = b[OBS][:, 2] != 99
    assert her.any() and (~her).any()
    env = b[OBS][her, 1].long()
    final = torch.tensor(lengths, dtype=torch.float32)[env] - 1  # last step's position
    assert torch.all(b[OBS][her, 2] == final)
    assert torch.all(b[OBS2][her, 2] == final)
    assert torch.all(b[REW][her, 0] == (b[OBS2][her, 0] == final).float())
    assert torch.all(b[OBS][her, 0] < final)  # the last transition is not copied
    assert torch.all(b[REW][~her, 0] == 0)


def test_her_nstep_windows_stop_at_copy_end() -> None:
    """Section 'HER' with n_step: windows of hindsight copies never run into the next
    real episode."""
    buf = HERBuffer(200, "cpu", ACTOR, SimpleNamespace(gamma=0.5), None,
                    her_function=goal_her, n_step=3, seed=0)
    fill(buf, 12, n=1, ends={0: [3, 7, 11]})
    b = next(buf.generate_batches(1, 500))
    her = b[OBS][:, 2] != 0
    pos = b[OBS][her, 0]
    assert torch.all(b[OBS2][her, 0] <= b[OBS][her, 2])  # never past the copy's end
    assert torch.all(b["n_step"][her, 0] == torch.clamp(b[OBS2][her, 0] - pos, max=3))


def test_her_copy_single_tensor_and_manual_end() -> None:
    """Section 'HER': copy_single_tensor(key, position) and handle_end_of_episode()."""
    buf = HERBuffer(50, "cpu", ACTOR, ALGO, None, her_function=goal_her)
    fill(buf, 3, n=1)
    assert buf.copy_single_tensor(OBS, 1)[0, 0] == 1
    assert buf.copy_single_tensor(REW, 2).tolist() == [[2.0]]
    buf.handle_end_of_episode()
    assert buf.relabelled == 2


def test_her_copy_single_tensor_is_a_storage_row() -> None:
    """Section 'HER': copy_single_tensor(key, position) "generates a copy of tensor key
    at index position" - row `position` of the storage, every env, as get_data_slice and
    data count rows (it counted `position` within one env's current episode, so after an
    episode end it returned another step's data)."""
    buf = HERBuffer(50, "cpu", ACTOR, ALGO, None, her_function=goal_her, seed=0)
    fill(buf, 6, ends={0: [3], 1: [1]})  # both envs ended an episode: copies were made
    assert buf.relabelled > 0
    data = buf.data
    for key in (OBS, ACT, REW, OBS2, DONE2):
        for pos in range(-6, 6):
            got = buf.copy_single_tensor(key, pos)
            assert isinstance(got, np.ndarray) and got.dtype == np.float32
            np.testing.assert_array_equal(got, data[key][pos])
            np.testing.assert_array_equal(got, buf.get_data_slice(pos % 6, pos % 6 + 1)[key][0])
    assert buf.copy_single_tensor(OBS, 1)[:, 0].tolist() == [1.0, 1.0]  # both envs, step 1
    copy_ = buf.copy_single_tensor(OBS, 0)
    copy_[...] = 99.0  # a copy: the storage keeps its data
    assert buf.copy_single_tensor(OBS, 0)[:, 0].tolist() == [0.0, 0.0]
    msg = rejects(buf, lambda b: b.copy_single_tensor(OBS, 6), ConfigError)
    assert "position=6" in msg and "[-6, 6)" in msg
    msg = rejects(buf, lambda b: b.copy_single_tensor(ACTPROBS, 0), ArgumentError)
    assert "ActionProbs" in msg and "Observation" in msg


# ------------------------------------------------------------------ every section
def her_fn(o: Any, rhs: Any, o2: Any, rhs2: Any, r: Any, initial_state: Any,
           final_state: Any) -> tuple[Any, Any, Any, Any, Any]:
    return o, rhs, o2, rhs2, r


@pytest.mark.parametrize("cls, args, attrs", [
    (ReplayBuffer, {}, {}),
    (NStepReplayBuffer, {"n_step": 2.0}, {"n_step": 2}),
    (PERBuffer, {"n_step": 3, "epsilon": 0.1, "alpha": 0.5, "beta": 0.3,
                 "default_error": 7}, {"n_step": 3, "epsilon": 0.1, "alpha": 0.5,
                                       "beta": 0.3, "default_error": 7.0}),
    (EREBuffer, {"n_step": 2, "epsilon": 0.1, "alpha": 0.5, "beta": 0.3,
                 "default_error": 7, "eta": 0.99, "cmin": 40},
     {"n_step": 2, "alpha": 0.5, "eta": 0.99, "cmin": 40, "default_error": 7.0}),
    (HERBuffer, {"her_function": her_fn, "n_step": 2, "epsilon": 0.1, "alpha": 0.5,
                 "beta": 0.3, "default_error": 7, "eta": 0.99, "cmin": 40},
     {"her_function": her_fn, "n_step": 2, "beta": 0.3, "eta": 0.99, "cmin": 40}),
])
def test_every_section_create_factory_passes_its_arguments(cls: Any, args: dict[str, Any],
                                                           attrs: dict[str, Any]) -> None:
    """Every section's create_factory(size, ...): the returned function takes (device,
    actor, algorithm, envs) and builds the documented class with the factory's
    arguments, by keyword and by position as the constructor takes them."""
    made = cls.create_factory(30, **args)("cpu", ACTOR, ALGO, None)
    assert type(made) is cls and made.max_size == 30 and made.device == "cpu"
    assert made.actor is ACTOR and made.algo is ALGO
    for name, value in attrs.items():
        assert getattr(made, name) == value
    direct = cls(30, "cpu", ACTOR, ALGO, None, *args.values())
    for name, value in attrs.items():
        assert getattr(direct, name) == value


def test_nstep_n_step_int_or_float() -> None:
    """Section 'N-Step Replay Buffer': n_step (int or float) - a whole float is taken,
    anything else is a ConfigError naming n_step."""
    assert NStepReplayBuffer(10, "cpu", ACTOR, ALGO, None, n_step=3.0).n_step == 3
    for bad in (2.5, 0, -1, True):
        with pytest.raises(ConfigError, match="n_step"):
            NStepReplayBuffer(10, "cpu", ACTOR, ALGO, None, n_step=bad)


def test_nstep_needs_algorithm_gamma() -> None:
    """Section 'N-Step Replay Buffer': algorithm (Algorithm) - pytorchrl reads
    algorithm.gamma and documents no default. An algorithm without gamma is refused,
    naming algorithm.gamma, wherever n-step returns need it (it silently discounted
    with 0.99); without n-step returns nothing reads it."""
    no_gamma = SimpleNamespace(discount=0.5)
    for make in (lambda: NStepReplayBuffer(10, "cpu", ACTOR, no_gamma, None, n_step=2),
                 lambda: PERBuffer(10, "cpu", ACTOR, None, None, n_step=3, alpha=0.5),
                 lambda: NStepReplayBuffer.create_factory(10, n_step=2)(
                     "cpu", ACTOR, no_gamma, None)):
        with pytest.raises(ArgumentError, match=r"algorithm\.gamma") as info:
            make()
        assert "n_step=" in str(info.value) and "gamma=0.99" in str(info.value)
    NStepReplayBuffer.create_factory(10, n_step=2)  # the algorithm comes later
    buf = NStepReplayBuffer(10, "cpu", ACTOR, no_gamma, None, n_step=1)  # gamma unused
    fill(buf, 3, n=1)
    assert buf.gamma is None and next(buf.generate_batches(1, 4))["n_step"] == 1
    msg = rejects(buf, lambda b: b.update_storage_parameter("n_step", 2), ConfigError)
    assert "gamma" in msg and "update_storage_parameter('gamma'" in msg
    buf.update_storage_parameter("gamma", 0.5)
    buf.update_storage_parameter("n_step", 2)
    b = next(buf.generate_batches(1, 64))
    full = b["n_step"][:, 0] == 2
    assert full.any() and torch.allclose(b[REW][full, 0], b[OBS][full, 0] * 1.5 + 0.5)


def test_device_parameter_places_batches() -> None:
    """Section 'Replay buffer': device - where batch tensors are placed (a string or a
    torch.device)."""
    dev = torch.device("cpu")
    buf = PERBuffer(20, dev, ACTOR, ALGO, None, n_step=2, alpha=0.5, seed=0)
    fill(buf, 5)
    b = next(buf.generate_batches(1, 4))
    assert all(v.device == dev for v in b.values() if isinstance(v, torch.Tensor))


def test_per_ere_update_storage_parameter() -> None:
    """Sections 'Prioritized Experience Replay Buffer' and 'ERE':
    update_storage_parameter changes beta (the next batches' weights) and cmin (the
    next windows)."""
    buf = PERBuffer(50, "cpu", ACTOR, ALGO, None, alpha=1.0, beta=1.0, seed=0)
    fill(buf, 10)
    b = next(buf.generate_batches(1, 8))
    buf.after_gradients(b, {"Algorithm": {"errors": torch.rand(8, 1)}})
    buf.update_storage_parameter("beta", 0.0)
    assert buf.beta == 0.0
    assert torch.all(next(buf.generate_batches(1, 64))["per_weights"] == 1.0)
    ere = EREBuffer(500, "cpu", ACTOR, ALGO, None, eta=0.5, cmin=10, seed=0)
    fill(ere, 100, n=1)
    assert list(ere.generate_batches(2, 4))[1]["ck"] == 10
    ere.update_storage_parameter("cmin", 30)
    b = list(ere.generate_batches(2, 64))[1]
    assert b["ck"] == 30 and b[OBS][:, 0].min().item() >= 70


# ------------------------------------------------------------------ recurrent actors
RNN_ACTOR = SimpleNamespace(is_recurrent=True, sequence_overlap=0.5)
RNN_ALGO = SimpleNamespace(gamma=0.9, update_every=4)  # sequences of 4: 2 overlap + 2


def rnn_transition(t: int, n: int = 2, done2: Any = None) -> dict[str, Any]:
    """transition(t) with hidden states t (RHS) and t + 1 (RHS2)."""
    s = transition(t, n, done2)
    s[RHS] = torch.full((n, 2), float(t))
    s[RHS2] = torch.full((n, 2), float(t + 1))
    return s


def r2d2_oracle(errors: list[float], eps: float, alpha: float, eta: float = 0.9) -> float:
    """Plain loop: pytorchrl's sequence priority, get_sequence_priority over the
    get_priority of each trained step."""
    p = [(abs(e) + eps) ** alpha for e in errors]
    return eta * max(p) + (1 - eta) * sum(p) / len(p)


def test_recurrent_per_sequence_priorities_against_plain_loop() -> None:
    """Section 'Prioritized Experience Replay Buffer' (recurrent actor): after_gradients
    takes one TD error per trained (non-overlap) step of each window and sets the
    window's priority get_sequence_priority(get_priority(errors), eta=0.9) = 0.9 * max +
    0.1 * mean; per_weights [S * sequence_length, 1] repeat each window's
    (N P(i)) ** -beta / max."""
    eps, alpha, beta = 0.01, 0.6, 0.4
    buf = PERBuffer(100, "cpu", RNN_ACTOR, RNN_ALGO, None, epsilon=eps, alpha=alpha,
                    beta=beta, default_error=50.0, seed=0)
    for t in range(30):
        buf.insert_transition(rnn_transition(t))
    buf.before_gradients()
    b = next(buf.generate_batches(1, 16))  # 16 // 4 + 1 = 5 windows
    assert b["idxs"].shape == (5,) and b["per_weights"].shape == (20, 1)
    assert torch.all(b["per_weights"].reshape(5, 4) == b["per_weights"][::4])
    starts = b["idxs"].copy()
    errors = torch.rand(5 * 2) * 3
    oracle: dict[int, float] = {}
    for i, key in enumerate(starts.tolist()):  # the last update of a repeated start wins
        oracle[key] = r2d2_oracle(errors[2 * i:2 * i + 2].tolist(), eps, alpha)
    assert buf.after_gradients(b, {"Algorithm": {"errors": errors}}) is not None
    assert "idxs" not in b
    per = buf.buffer.sampler
    core = buf.buffer
    slots = core.table.slots_of(np.array(sorted(oracle)))
    np.testing.assert_allclose(per.priorities(slots), [oracle[k] for k in sorted(oracle)],
                               rtol=1e-9)
    # the weights of the next windows: (p_i / p_min) ** -beta, p_min the smallest priority
    p_min = min(oracle.values())
    default = (50.0 + eps) ** alpha
    b = next(buf.generate_batches(1, 200))
    for i, key in enumerate(b["idxs"].tolist()):
        p = oracle.get(key, default)
        assert b["per_weights"][4 * i, 0].item() == pytest.approx((p / p_min) ** -beta,
                                                                  rel=1e-4)
    with pytest.raises(ValueError, match="one TD error per trained"):
        buf.after_gradients(b, {"Algorithm": {"errors": torch.ones(3)}})
    with pytest.raises(ArgumentError, match="errors"):
        buf.after_gradients(b, {"Algorithm": {}})


def test_recurrent_per_draws_follow_sequence_priority() -> None:
    """Section 'Prioritized Experience Replay Buffer' (recurrent actor): windows are
    drawn in proportion to their sequence priority."""
    buf = PERBuffer(100, "cpu", RNN_ACTOR, RNN_ALGO, None, epsilon=0.0, alpha=1.0,
                    default_error=1e-6, seed=0)
    for t in range(30):
        buf.insert_transition(rnn_transition(t, n=1))
    b = next(buf.generate_batches(1, 4))  # 2 windows
    hot = int(b["idxs"][0])
    b["idxs"] = np.array([hot])
    buf.after_gradients(b, {"Algorithm": {"errors": torch.tensor([[100.0], [1.0]])}})
    b = next(buf.generate_batches(1, 400))
    assert np.mean(b["idxs"] == hot) > 0.95


def test_recurrent_ere_windows_and_ck() -> None:
    """Section 'ERE' (recurrent actor): mini batch k of K draws windows that start among
    the newest c_k = max(N * eta ** (1000 k / K), cmin) steps; 'ck' is that window in
    sequences per env, as pytorchrl counts it; with PER after_gradients pops idxs and
    ck. A window too small for one sequence raises a ConfigError naming cmin."""
    buf = EREBuffer(500, "cpu", RNN_ACTOR, RNN_ALGO, None, eta=0.9, cmin=16, seed=0)
    for t in range(100):
        buf.insert_transition(rnn_transition(t))
    batches = list(buf.generate_batches(4, 40))
    assert [b["ck"] for b in batches] == [200 // 8, 2, 2, 2]
    for b in batches[1:]:  # 16 steps: the newest 8 of each env
        first = b[OBS][::4, 0]
        assert first.min().item() >= 92 and (first + 3).max().item() <= 99
    assert "per_weights" not in batches[0]
    small = EREBuffer(500, "cpu", RNN_ACTOR, RNN_ALGO, None, eta=0.5, cmin=4, seed=0)
    for t in range(40):
        small.insert_transition(rnn_transition(t))
    with pytest.raises(ConfigError, match="raise cmin to at least"):
        list(small.generate_batches(2, 8))  # mini batch 1: 2 steps per env
    per = EREBuffer(500, "cpu", RNN_ACTOR, RNN_ALGO, None, alpha=0.6, epsilon=0.01,
                    eta=0.9, cmin=16, seed=0)
    for t in range(100):
        per.insert_transition(rnn_transition(t))
    b = list(per.generate_batches(2, 8))[1]
    assert b["per_weights"].shape == (12, 1) and b["ck"] == 2
    info = per.after_gradients(b, {"Algorithm": {"errors": torch.ones(3 * 2)}})
    assert "idxs" not in b and "ck" not in b and info["Algorithm"]["errors"].shape == (6,)


def test_recurrent_too_few_rows_error_speaks_pytorchrl() -> None:
    """Fewer rows than update_every: the error names the storage's call and settings, not
    the core's sample_sequences, width, strict or episode_boundary (which its users never
    pass)."""
    buf = ReplayBuffer(50, "cpu", RNN_ACTOR, RNN_ALGO, None, seed=0)
    for t in range(3):
        buf.insert_transition(rnn_transition(t))
    with pytest.raises(EmptyBufferError) as err:
        next(buf.generate_batches(1, 12))
    msg = str(err.value)
    assert msg.startswith("ReplayBuffer.generate_batches: ") and "update_every=4" in msg
    assert "3 rows per env" in msg and "insert more transitions" in msg, msg
    for core in ("sample_sequences", "width=", "strict", "episode_boundary", "burn_in"):
        assert core not in msg, (core, msg)
    buf.insert_transition(rnn_transition(3))  # a full sequence now
    assert next(buf.generate_batches(1, 12))[OBS].shape == (16, 3)


def test_recurrent_her_copies_keep_hidden_states() -> None:
    """Section 'HER' (recurrent actor): her_function receives the hidden states of each
    transition ([1, ...]) and what it returns is stored; windows over the hindsight
    copies carry the copies' hidden state at their first step."""
    seen: list[tuple[Any, Any]] = []

    def her(o: Any, rhs: Any, o2: Any, rhs2: Any, r: Any, initial_state: Any,
            final_state: Any) -> tuple[Any, Any, Any, Any, Any]:
        seen.append((rhs.shape, rhs2.shape))
        o, o2 = o.copy(), o2.copy()
        o[:, 2] = o2[:, 2] = final_state[:, 0]
        return o, rhs + 1000, o2, rhs2 + 1000, np.ones((1, 1), np.float32)

    buf = HERBuffer(200, "cpu", RNN_ACTOR, RNN_ALGO, None, her_function=her, seed=0)
    for t in range(40):
        buf.insert_transition(rnn_transition(t, n=1, done2=[float(t % 10 == 9)]))
    assert buf.relabelled == 4 * 9 and seen[0] == ((1, 2), (1, 2))
    b = next(buf.generate_batches(1, 400))
    first = b[OBS][::4]  # [S, 3]: each window's first row
    her_rows = first[:, 2] != 0
    assert her_rows.any() and (~her_rows).any()
    assert torch.all(b[RHS][her_rows, 0] == first[her_rows, 0] + 1000)
    assert torch.all(b[RHS][~her_rows, 0] == first[~her_rows, 0])
    assert torch.all(b[RHS2][her_rows, 0] == first[her_rows, 0] + 1001)
    rows = b[OBS][:, 2] != 0
    assert torch.all(b[REW][rows, 0] == 1.0) and torch.all(b[REW][~rows, 0] == b[OBS][~rows, 0])


def test_recurrent_insert_data_slice_drops_resent_overlap() -> None:
    """Sections 'Replay buffer' (insert_data_slice, reset, get_all_buffer_data with a
    recurrent actor): a collector exports whole sequences and stages its last
    overlap_length rows; after reset they lead its next export. The learner drops
    leading rows that repeat its newest rows, so each step is stored once, in order."""
    col = ReplayBuffer(100, "cpu", RNN_ACTOR, RNN_ALGO, None, seed=0)
    learner = ReplayBuffer(100, "cpu", RNN_ACTOR, RNN_ALGO, None, seed=1)
    t = 0
    exported = []
    for steps in (8, 6, 8, 5):
        for _ in range(steps):
            col.insert_transition(rnn_transition(t))
            t += 1
        data = col.get_all_buffer_data(data_to_cpu=True)
        exported.append(data[OBS][:, 0, 0].tolist())
        col.reset()
        learner.insert_data_slice(data)
    # whole sequences only; the staged rows (the last 2 exported and those held back)
    # lead the next export
    assert exported == [list(range(8)), list(range(6, 14)), list(range(12, 20)),
                        list(range(18, 26))]
    got = learner.data[OBS][:, 0, 0].tolist()
    assert got == list(range(26))  # no duplicated overlap rows, nothing lost or reordered
    np.testing.assert_array_equal(learner.data[RHS][:, :, 0], learner.data[OBS][:, :, 0])
    other = ReplayBuffer(100, "cpu", RNN_ACTOR, RNN_ALGO, None)
    rows = learner.data
    other.insert_data_slice(_rows_of(rows, 20, 24))
    other.insert_data_slice(_rows_of(rows, 22, 26))  # 22, 23 repeat the newest: dropped
    assert other.data[OBS][:, 0, 0].tolist() == [20, 21, 22, 23, 24, 25]
    other.insert_data_slice(_rows_of(rows, 20, 24))  # 20, 21 are not the newest: kept
    assert other.size == 10


def _rows_of(data: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    return {k: None if v is None else v[a:b] for k, v in data.items()}


def test_recurrent_nstep_sequences_against_plain_loop() -> None:
    """Section 'N-Step Replay Buffer' (recurrent actor): as pytorchrl stores n-step
    transitions for recurrent actors too, every row of a window holds its own truncated
    n-step return, NextObservation and NextDone of the window's last step and n_step
    (its window length), while Observation, Action and the hidden states stay the
    window's consecutive steps."""
    n, gamma = 3, 0.9
    buf = NStepReplayBuffer(200, "cpu", RNN_ACTOR, SimpleNamespace(gamma=gamma,
                                                                   update_every=4),
                            None, n_step=n, seed=0)
    ends0 = {4, 9, 10, 17, 30}
    for t in range(32):
        buf.insert_transition(rnn_transition(t, n=1, done2=[float(t in ends0)]))
    rewards = [float(t) for t in range(32)]
    ends = [t in ends0 for t in range(32)]
    b = next(buf.generate_batches(1, 200))
    assert b["n_step"].shape == (b[OBS].shape[0], 1)
    seq = b[OBS][:, 0].reshape(-1, 4)
    assert torch.all(seq[:, 1:] - seq[:, :-1] == 1)
    assert torch.all(b[RHS][:, 0] == seq[:, 0])
    for i in range(b[OBS].shape[0]):
        t = int(b[OBS][i, 0])
        g, k, done = nstep_oracle(rewards, ends, t, n, gamma)
        assert b[REW][i, 0].item() == pytest.approx(g, rel=1e-6)
        assert b["n_step"][i, 0].item() == k
        assert b[OBS2][i, 0].item() == t + k
        assert b[DONE2][i, 0].item() == float(done)
    buf.update_storage_parameter("n_step", 1)
    b = next(buf.generate_batches(1, 8))
    assert b["n_step"] == 1 and torch.all(b[REW][:, 0] == b[OBS][:, 0])


# ------------------------------------------------------------------ a training loop
class QActor:
    """A minimal pytorchrl-like actor: a Q network."""

    is_recurrent = False

    def __init__(self, obs_dim: int, n_act: int) -> None:
        self.q = torch.nn.Sequential(torch.nn.Linear(obs_dim, 64), torch.nn.ReLU(),
                                     torch.nn.Linear(64, n_act))


def dqn_cartpole(iters: int, seed: int = 0) -> tuple[list[float], Any, float]:
    """A pytorchrl-style DQN loop on CartPole-v1 (the collector's insert_transition ->
    get_all_buffer_data -> reset, the learner's insert_data_slice -> before_gradients ->
    generate_batches -> after_gradients), PER + 3-step returns, written against
    pytorchrl's API: only the import differs. Each iteration collects 25 steps of 2
    envs and makes 25 updates of 64; the target network follows every 4 iterations.
    Returns the finished episodes' returns, the learner's storage and the seconds
    taken."""
    import time

    gym = pytest.importorskip("gymnasium")
    from replaybank.compat.pytorchrl import PERBuffer as Storage

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small networks: threads only contend on a shared machine
    try:
        torch.manual_seed(seed)
        n_envs = 2
        envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n_envs,
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        actor = QActor(4, 2)
        target = QActor(4, 2)
        target.q.load_state_dict(actor.q.state_dict())
        algo = SimpleNamespace(gamma=0.99, update_every=25, num_mini_batch=25,
                               mini_batch_size=64, num_epochs=1)
        make = Storage.create_factory(size=20_000, n_step=3, epsilon=1e-3, alpha=0.6,
                                      beta=0.4)
        collector = make("cpu", actor, algo, envs)  # pytorchrl's collection worker's
        storage = make("cpu", actor, algo, envs)  # the gradient worker's
        storage.seed = seed  # the front end's addition: the core's draws (before any add)
        opt = torch.optim.Adam(actor.q.parameters(), lr=1e-3)
        obs_np, _ = envs.reset(seed=seed)
        obs, done = torch.as_tensor(obs_np), torch.zeros(n_envs, 1)
        returns: list[float] = []
        ep_ret = np.zeros(n_envs)
        eps = 1.0
        start = time.perf_counter()
        for it in range(iters):
            for _ in range(algo.update_every):  # collection
                with torch.no_grad():
                    q = actor.q(obs)
                act = q.argmax(1, keepdim=True)
                rand = torch.rand(n_envs, 1) < eps
                act = torch.where(rand, torch.randint(0, 2, (n_envs, 1)), act)
                obs2_np, rew, term, trunc, info = envs.step(act[:, 0].numpy())
                final = obs2_np.copy()
                if "final_obs" in info:
                    for e in np.flatnonzero(info["_final_obs"]):
                        final[e] = info["final_obs"][e]
                collector.insert_transition({
                    "Observation": obs, "RecurrentHiddenStates": torch.zeros(n_envs, 1),
                    "Done": done, "Action": act.float(),
                    "Reward": torch.as_tensor(rew, dtype=torch.float32)[:, None],
                    "NextObservation": torch.as_tensor(final),
                    "NextRecurrentHiddenStates": torch.zeros(n_envs, 1),
                    "NextDone": torch.as_tensor(term, dtype=torch.float32)[:, None]})
                ep_ret += rew
                for e in np.flatnonzero(term | trunc):
                    returns.append(float(ep_ret[e]))
                    ep_ret[e] = 0
                obs = torch.as_tensor(obs2_np)
                done = torch.as_tensor(term | trunc, dtype=torch.float32)[:, None]
            eps = max(0.05, eps * 0.95)
            data = collector.get_all_buffer_data(data_to_cpu=False)
            collector.reset()
            storage.insert_data_slice(data)
            storage.before_gradients()
            for batch in storage.generate_batches(algo.num_mini_batch,
                                                  algo.mini_batch_size, algo.num_epochs):
                with torch.no_grad():
                    q_next = target.q(batch["NextObservation"]).max(1, keepdim=True)[0]
                    q_targ = batch["Reward"] + algo.gamma ** batch["n_step"] * (
                        1 - batch["NextDone"]) * q_next
                q_exp = actor.q(batch["Observation"]).gather(1, batch["Action"].long())
                loss = (batch["per_weights"] * (q_exp - q_targ) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                errors = (q_exp - q_targ).abs().detach()
                storage.after_gradients(batch, {"Algorithm": {"errors": errors}})
            if it % 4 == 3:
                target.q.load_state_dict(actor.q.state_dict())
        return returns, storage, time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)


def test_dqn_cartpole_per_nstep_loop() -> None:
    """The pytorchrl-style DQN loop learns CartPole-v1: 150 iterations (7,500 env steps,
    3,750 updates) take about 5 s and the last 10 episodes average well above a random
    policy's ~22. The collector -> learner transfer neither duplicates nor drops rows."""
    returns, storage, _ = dqn_cartpole(150)
    assert storage.size == 150 * 25  # every exported row arrived once
    assert storage.step == storage.size
    assert len(returns) > 50
    assert np.mean(returns[-10:]) > 80, returns[-20:]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_dqn_cartpole_learns_longer(seed: int) -> None:
    """The same loop, 300 iterations: CartPole-v1 returns of the last 10 episodes
    above 150."""
    returns, _, _ = dqn_cartpole(300, seed=seed)
    assert np.mean(returns[-10:]) > 150, returns[-20:]


# ------------------------------------------------------------------ hardening (issue items)
def snapshot(buf: Any) -> dict[str, Any]:
    """Everything a call could change: the storage's attributes and the core's state
    (not the memos of checks that passed: the parsed device, the last key set)."""
    out: dict[str, Any] = {"size": buf.size, "step": buf.step}
    for k, v in vars(buf).items():
        if k not in ("buffer", "_torch_device", "_zero_tensors", "_recent", "_keys_seen"):
            out["attr/" + k] = repr(v)
    if buf.buffer is not None:
        def walk(d: Any, prefix: str) -> None:
            for k, v in d.items():
                if isinstance(v, dict):
                    walk(v, f"{prefix}{k}/")
                else:
                    out[prefix + k] = (v.dtype.str, v.shape, v.tobytes()) \
                        if isinstance(v, np.ndarray) else repr(v)
        walk(buf.buffer.state_dict(), "core/")
    return out


def rejects(buf: Any, call: Any, exc: type[Exception] = ReplayBankError) -> str:
    """``call(buf)`` raises a library error (``exc``) with a message and changes
    nothing."""
    before = snapshot(buf)
    with pytest.raises(exc) as info:
        call(buf)
    assert isinstance(info.value, ReplayBankError), type(info.value)
    assert str(info.value)
    assert snapshot(buf) == before
    return str(info.value)


def per_filled(**kw: Any) -> PERBuffer:
    buf = PERBuffer(40, "cpu", ACTOR, ALGO, None, n_step=2, alpha=0.6, beta=0.4,
                    epsilon=1e-3, seed=0, **kw)
    fill(buf, 8)
    return buf


def test_per_after_gradients_rejected_update_keeps_idxs() -> None:
    """Issue 5: a rejected after_gradients left the batch without 'idxs' (popped before
    the errors were checked), so a retry failed with KeyError: 'idxs'. Now nothing
    changes, the batch included, and the retry works."""
    buf = per_filled()
    batch = next(buf.generate_batches(1, 8))
    keys = batch["idxs"].copy()
    for bad in (torch.ones(3, 1), torch.full((8, 1), float("nan")), -torch.ones(8, 1)):
        rejects(buf, lambda b, bad=bad: b.after_gradients(batch, {"Algorithm": {"errors": bad}}))
        assert "idxs" in batch and np.array_equal(batch["idxs"], keys)
    rejects(buf, lambda b: b.after_gradients(batch, {"Algorithm": {}}), ArgumentError)
    assert "idxs" in batch
    info = {"Algorithm": {"errors": torch.full((8, 1), 2.0)}}
    assert buf.after_gradients(batch, info) is info  # the retry
    assert "idxs" not in batch
    msg = rejects(buf, lambda b: b.after_gradients(batch, info), ArgumentError)
    assert "idxs" in msg  # a batch used twice: named


def test_per_alpha_nan_and_non_positive_batch_counts_are_refused() -> None:
    """Issue 10: PERBuffer(alpha=nan) meant "PER off"; generate_batches(0 | -1, 8)
    yielded nothing. pytorchrl documents alpha as a float (PER's alpha >= 0, 0 = off)
    and num_mini_batch as the number of mini batches: both are refused now."""
    for alpha in (float("nan"), -0.5, float("inf")):
        with pytest.raises(ConfigError, match="alpha"):
            PERBuffer(10, "cpu", ACTOR, ALGO, None, alpha=alpha)
        with pytest.raises(ConfigError, match="alpha"):
            PERBuffer.create_factory(10, alpha=alpha)
    buf = per_filled()
    for k in (0, -1):
        msg = rejects(buf, lambda b, k=k: next(b.generate_batches(k, 8)), ConfigError)
        assert "num_mini_batch" in msg and str(k) in msg
    rejects(buf, lambda b: next(b.generate_batches(1, 0)), ConfigError)


def test_get_priority_tensor_in_tensor_out() -> None:
    """Issue 15: get_priority of a torch tensor returned a numpy array; pytorchrl's
    ``(error + epsilon) ** alpha`` keeps a tensor a tensor, on its device."""
    buf = PERBuffer(10, "cpu", ACTOR, ALGO, None, epsilon=0.5, alpha=0.7)
    err = torch.tensor([[0.0], [1.0], [3.5]])
    out = buf.get_priority(err)
    assert isinstance(out, torch.Tensor)
    assert out.device == err.device and out.dtype == err.dtype and out.shape == err.shape
    torch.testing.assert_close(out, (err + 0.5) ** 0.7)
    assert isinstance(buf.get_priority(np.array([1.0])), np.ndarray)
    seq = torch.tensor([[1.0, 4.0], [3.0, 0.0]])
    assert isinstance(buf.get_sequence_priority(seq), torch.Tensor)
    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        cuda = buf.get_priority(err.cuda())
        assert cuda.device.type == "cuda"


def test_sequence_priority_refuses_what_get_priority_refuses() -> None:
    """The migration doc: get_priority and get_sequence_priority both refuse values that
    are negative, NaN or infinite (get_sequence_priority took them and returned 1.85,
    nan, inf or a negative priority). One check serves both: the same values are
    refused, each message naming its own argument."""
    buf = PERBuffer(10, "cpu", ACTOR, ALGO, None, alpha=0.5)
    for bad in ([-1.0, 2.0], [NAN, 2.0], [np.inf, 2.0], [2.0, -np.inf]):
        for data in (np.array(bad), torch.tensor(bad)):
            with pytest.raises(DtypeError, match=r"get_priority: error holds") as one:
                buf.get_priority(data)
            with pytest.raises(DtypeError,
                               match=r"get_sequence_priority: sequence_data holds") as two:
                buf.get_sequence_priority(data)
            assert str(one.value).split("holds ")[1].split("]")[0] == \
                str(two.value).split("holds ")[1].split("]")[0]
    fine = np.array([[0.0, 1.0], [3.0, 0.5]])
    np.testing.assert_allclose(buf.get_sequence_priority(fine),
                               0.9 * fine.max(0) + 0.1 * fine.mean(0))


def her_filled(her_function: Any = None) -> HERBuffer:
    """A HER storage of 5 steps (env 0's first episode ended at step 2, unless a
    her_function is given: then no episode ended yet)."""
    fn = goal_her if her_function is None else her_function
    buf = HERBuffer(40, "cpu", ACTOR, ALGO, None, her_function=fn, seed=0)
    fill(buf, 5, ends={0: [2]} if her_function is None else None)
    return buf


def good_transition(t: int = 50, n: int = 2, **over: Any) -> dict[str, Any]:
    s = transition(t, n)
    s.update(over)
    return s


def without(key: str) -> dict[str, Any]:
    s = transition(50)
    del s[key]
    return s


NAN = float("nan")
FRESH = "fresh"  # a storage nothing was inserted into
#: (name, which storage, call, the library error expected)
HOSTILE: list[tuple[str, str, Any, type[Exception]]] = [
    # insert_transition / init_tensors
    ("insert_transition(None)", "per", lambda b: b.insert_transition(None), ArgumentError),
    ("insert_transition('x')", "per", lambda b: b.insert_transition("x"), ArgumentError),
    ("insert_transition([1])", "per", lambda b: b.insert_transition([1]), ArgumentError),
    ("insert_transition(5)", "per", lambda b: b.insert_transition(5), ArgumentError),
    ("insert_transition({})", "per", lambda b: b.insert_transition({}), SpecError),
    ("insert_transition(no Action)", "per", lambda b: b.insert_transition(without(ACT)),
     SpecError),
    ("insert_transition(no Done, first had it)", "per",
     lambda b: b.insert_transition(without(DONE)), SpecError),
    ("insert_transition(new IntrinsicReward)", "per",
     lambda b: b.insert_transition(good_transition(**{IREW: torch.ones(2, 1)})), SpecError),
    ("insert_transition(3 envs into 2)", "per",
     lambda b: b.insert_transition(transition(50, n=3)), ShapeError),
    ("insert_transition(Reward [3, 1])", "per",
     lambda b: b.insert_transition(good_transition(Reward=torch.ones(3, 1))), ShapeError),
    ("insert_transition(Reward None)", "per",
     lambda b: b.insert_transition(good_transition(Reward=None)), DtypeError),
    ("insert_transition(Observation 'abc')", "per",
     lambda b: b.insert_transition(good_transition(Observation="abc")), DtypeError),
    ("insert_transition(Observation [2, 4])", "per",
     lambda b: b.insert_transition(good_transition(Observation=torch.ones(2, 4))),
     ShapeError),
    ("insert_transition(Observation [1, 3])", "per",
     lambda b: b.insert_transition(good_transition(Observation=torch.ones(1, 3))),
     ShapeError),
    ("insert_transition(NextDone nan)", "per",
     lambda b: b.insert_transition(good_transition(NextDone=torch.full((2, 1), NAN))),
     DtypeError),
    ("insert_transition(NextDone 0.5)", "per",
     lambda b: b.insert_transition(good_transition(NextDone=torch.full((2, 1), 0.5))),
     DtypeError),
    ("first insert_transition(NextDone nan)", FRESH,
     lambda b: b.insert_transition(good_transition(NextDone=torch.full((2, 1), NAN))),
     DtypeError),
    ("first insert_transition(Reward [3, 1])", FRESH,
     lambda b: b.insert_transition(good_transition(Reward=torch.ones(3, 1))), ShapeError),
    ("first insert_transition(NextDone [])", FRESH,
     lambda b: b.insert_transition(good_transition(NextDone=torch.ones(0, 1))), ShapeError),
    ("first insert_transition(Action 'a')", FRESH,
     lambda b: b.insert_transition(good_transition(Action=np.array(["a", "b"]))), DtypeError),
    ("init_tensors(None)", "per", lambda b: b.init_tensors(None), ArgumentError),
    ("init_tensors({})", "per", lambda b: b.init_tensors({}), SpecError),
    # generate_batches
    ("generate_batches(None, 8)", "per", lambda b: next(b.generate_batches(None, 8)),
     ArgumentError),
    ("generate_batches('x', 8)", "per", lambda b: next(b.generate_batches("x", 8)),
     ArgumentError),
    ("generate_batches(2.5, 8)", "per", lambda b: next(b.generate_batches(2.5, 8)),
     ArgumentError),
    ("generate_batches(nan, 8)", "per", lambda b: next(b.generate_batches(NAN, 8)),
     ArgumentError),
    ("generate_batches(True, 8)", "per", lambda b: next(b.generate_batches(True, 8)),
     ArgumentError),
    ("generate_batches(0, 8)", "per", lambda b: next(b.generate_batches(0, 8)), ConfigError),
    ("generate_batches(-1, 8)", "per", lambda b: next(b.generate_batches(-1, 8)),
     ConfigError),
    ("generate_batches(1, None)", "per", lambda b: next(b.generate_batches(1, None)),
     ArgumentError),
    ("generate_batches(1, -1)", "per", lambda b: next(b.generate_batches(1, -1)),
     ConfigError),
    ("generate_batches(1, 8, 0)", "per", lambda b: next(b.generate_batches(1, 8, 0)),
     ConfigError),
    ("generate_batches(1, 8, None)", "per", lambda b: next(b.generate_batches(1, 8, None)),
     ArgumentError),
    ("generate_batches(empty)", FRESH, lambda b: next(b.generate_batches(1, 8)),
     EmptyBufferError),
    # after_gradients
    ("after_gradients(None, info)", "per",
     lambda b: b.after_gradients(None, {"Algorithm": {"errors": torch.ones(8, 1)}}),
     ArgumentError),
    ("after_gradients(batch, None)", "per",
     lambda b: b.after_gradients(b.test_batch, None), ArgumentError),
    ("after_gradients(Algorithm None)", "per",
     lambda b: b.after_gradients(b.test_batch, {"Algorithm": None}),
     ArgumentError),
    ("after_gradients(errors 'x')", "per",
     lambda b: b.after_gradients(b.test_batch,
                                 {"Algorithm": {"errors": "x"}}), DtypeError),
    ("after_gradients(errors None)", "per",
     lambda b: b.after_gradients(b.test_batch,
                                 {"Algorithm": {"errors": None}}), DtypeError),
    ("after_gradients(errors [3, 1])", "per",
     lambda b: b.after_gradients(b.test_batch,
                                 {"Algorithm": {"errors": torch.ones(3, 1)}}), ShapeError),
    ("after_gradients(errors nan)", "per",
     lambda b: b.after_gradients(b.test_batch,
                                 {"Algorithm": {"errors": torch.full((8, 1), NAN)}}),
     DtypeError),
    ("after_gradients(no idxs)", "per",
     lambda b: b.after_gradients({"per_weights": torch.ones(8, 1)},
                                 {"Algorithm": {"errors": torch.ones(8, 1)}}), ArgumentError),
    ("after_gradients(idxs 'x')", "per",
     lambda b: b.after_gradients({"idxs": "x"}, {"Algorithm": {"errors": torch.ones(8, 1)}}),
     ShapeError),
    # get_priority / get_sequence_priority
    ("get_priority(None)", "per", lambda b: b.get_priority(None), DtypeError),
    ("get_priority('x')", "per", lambda b: b.get_priority("x"), DtypeError),
    ("get_priority([1, 'a'])", "per", lambda b: b.get_priority([1, "a"]), DtypeError),
    ("get_priority(tensor nan)", "per", lambda b: b.get_priority(torch.tensor([NAN])),
     DtypeError),
    ("get_priority(-1)", "per", lambda b: b.get_priority(np.array([-1.0])), DtypeError),
    ("get_sequence_priority(None)", "per", lambda b: b.get_sequence_priority(None),
     DtypeError),
    ("get_sequence_priority([])", "per", lambda b: b.get_sequence_priority(np.zeros(0)),
     ShapeError),
    ("get_sequence_priority(eta=nan)", "per",
     lambda b: b.get_sequence_priority(np.ones(3), eta=NAN), ConfigError),
    ("get_sequence_priority(eta='x')", "per",
     lambda b: b.get_sequence_priority(np.ones(3), eta="x"), ArgumentError),
    ("get_sequence_priority([-1, 2])", "per",
     lambda b: b.get_sequence_priority(np.array([-1.0, 2.0])), DtypeError),
    ("get_sequence_priority([nan, 2])", "per",
     lambda b: b.get_sequence_priority(np.array([NAN, 2.0])), DtypeError),
    ("get_sequence_priority([inf, 2])", "per",
     lambda b: b.get_sequence_priority(np.array([np.inf, 2.0])), DtypeError),
    ("get_sequence_priority(tensor -5)", "per",
     lambda b: b.get_sequence_priority(torch.tensor([[-5.0], [1.0]])), DtypeError),
    # data transfer
    ("get_all_buffer_data('x')", "per", lambda b: b.get_all_buffer_data("x"), ArgumentError),
    ("get_data_slice(None, 2)", "per", lambda b: b.get_data_slice(None, 2), ArgumentError),
    ("get_data_slice(0, 'x')", "per", lambda b: b.get_data_slice(0, "x"), ArgumentError),
    ("get_data_slice(2.5, 3)", "per", lambda b: b.get_data_slice(2.5, 3), ArgumentError),
    ("insert_data_slice(None)", "per", lambda b: b.insert_data_slice(None), ArgumentError),
    ("insert_data_slice('x')", "per", lambda b: b.insert_data_slice("x"), ArgumentError),
    ("insert_data_slice(Observation 'abc')", "per",
     lambda b: b.insert_data_slice({OBS: "abc"}), DtypeError),
    ("insert_data_slice(no Action)", "per",
     lambda b: b.insert_data_slice({k: v for k, v in b.data.items() if k != ACT}), SpecError),
    ("insert_data_slice(3 envs)", "per",
     lambda b: b.insert_data_slice({k: None if v is None else np.concatenate([v, v[:, :1]], 1)
                                    for k, v in b.data.items()}), ShapeError),
    ("insert_data_slice(NextDone nan in a later row)", "per",
     lambda b: b.insert_data_slice({**b.data, DONE2: np.where(
         np.arange(8)[:, None, None] == 5, NAN, np.zeros((8, 2, 1)))}), DtypeError),
    ("insert_data_slice(different lengths)", "per",
     lambda b: b.insert_data_slice({OBS: np.zeros((2, 2, 3)), ACT: np.zeros((3, 2, 1))}),
     ShapeError),
    ("insert_single_tensor_slice(None, ...)", "per",
     lambda b: b.insert_single_tensor_slice(None, "x", np.ones(2)), ArgumentError),
    ("insert_single_tensor_slice(key None)", "per",
     lambda b: b.insert_single_tensor_slice({}, None, np.ones(2)), ArgumentError),
    ("insert_single_tensor_slice(values None)", "per",
     lambda b: b.insert_single_tensor_slice({}, "x", None), DtypeError),
    ("insert_single_tensor_slice(values 0-d)", "per",
     lambda b: b.insert_single_tensor_slice({}, "x", np.float32(1)), ShapeError),
    ("insert_single_tensor_slice(rows of another shape)", "per",
     lambda b: b.insert_single_tensor_slice({"x": np.zeros((40, 3))}, "x", np.ones((2, 4))),
     ShapeError),
    # update_storage_parameter
    ("update_storage_parameter(None, 1)", "per",
     lambda b: b.update_storage_parameter(None, 1), ArgumentError),
    ("update_storage_parameter('max_size', 0)", "per",
     lambda b: b.update_storage_parameter("max_size", 0), ConfigError),
    ("update_storage_parameter('max_size', 'x')", "per",
     lambda b: b.update_storage_parameter("max_size", "x"), ArgumentError),
    ("update_storage_parameter('n_step', 0)", "per",
     lambda b: b.update_storage_parameter("n_step", 0), ConfigError),
    ("update_storage_parameter('n_step', 'x')", "per",
     lambda b: b.update_storage_parameter("n_step", "x"), ArgumentError),
    ("update_storage_parameter('alpha', nan)", "per",
     lambda b: b.update_storage_parameter("alpha", NAN), ConfigError),
    ("update_storage_parameter('beta', 2)", "per",
     lambda b: b.update_storage_parameter("beta", 2.0), ConfigError),
    ("update_storage_parameter('epsilon', None)", "per",
     lambda b: b.update_storage_parameter("epsilon", None), ArgumentError),
    ("update_storage_parameter('default_error', -1)", "per",
     lambda b: b.update_storage_parameter("default_error", -1.0), ConfigError),
    ("update_storage_parameter('gamma', 'x')", "per",
     lambda b: b.update_storage_parameter("gamma", "x"), ArgumentError),
    ("update_storage_parameter('device', 'bogus')", "per",
     lambda b: b.update_storage_parameter("device", "bogus"), ConfigError),
    ("update_storage_parameter('eta', 0)", "ere",
     lambda b: b.update_storage_parameter("eta", 0.0), ConfigError),
    ("update_storage_parameter('cmin', 'x')", "ere",
     lambda b: b.update_storage_parameter("cmin", "x"), ArgumentError),
    # ERE
    ("update_eta(None)", "ere", lambda b: b.update_eta(None), ArgumentError),
    ("update_eta(TrainReward 'x')", "ere",
     lambda b: b.update_eta({"Episodes": {"TrainReward": "x"}}), DtypeError),
    ("update_eta(TrainReward nan)", "ere",
     lambda b: b.update_eta({"Episodes": {"TrainReward": NAN}}), DtypeError),
    ("ERE after_gradients(TrainReward nan)", "ere",
     lambda b: b.after_gradients(b.test_batch, {"Algorithm": {"errors": torch.ones(8, 1)},
                                                "Episodes": {"TrainReward": NAN}}),
     DtypeError),
    # HER
    ("copy_single_tensor(position 99)", "her",
     lambda b: b.copy_single_tensor(OBS, 99), ConfigError),
    ("copy_single_tensor(position -99)", "her", lambda b: b.copy_single_tensor(OBS, -99),
     ConfigError),
    ("copy_single_tensor(position 'x')", "her", lambda b: b.copy_single_tensor(OBS, "x"),
     ArgumentError),
    ("copy_single_tensor(key 'nope')", "her", lambda b: b.copy_single_tensor("nope", 0),
     ArgumentError),
    ("handle_end_of_episode(5)", "her", lambda b: b.handle_end_of_episode(5), ConfigError),
    ("handle_end_of_episode(None)", "her", lambda b: b.handle_end_of_episode(None),
     ArgumentError),
    ("her_function of the wrong shape", "her_bad",
     lambda b: b.insert_transition(transition(5, done2=[1.0, 0.0])), ShapeError),
]


def bad_her(o: Any, rhs: Any, o2: Any, rhs2: Any, r: Any, initial_state: Any,
            final_state: Any) -> tuple[Any, Any, Any, Any, Any]:
    return o[:, :2], rhs, o2, rhs2, r  # drops an observation entry


def hostile_storage(kind: str) -> Any:
    """A storage of ``kind`` (with ``test_batch``, a batch drawn from it, an attribute
    of its own so that the snapshot sees a call change it)."""
    buf: Any
    if kind == FRESH:
        return PERBuffer(40, "cpu", ACTOR, ALGO, None, alpha=0.6, seed=0)
    if kind == "per":
        buf = per_filled()
    elif kind == "ere":
        buf = EREBuffer(100, "cpu", ACTOR, ALGO, None, alpha=0.6, eta=0.9, cmin=10, seed=0)
        fill(buf, 10)
    else:
        buf = her_filled(bad_her if kind == "her_bad" else None)
    buf.test_batch = next(buf.generate_batches(1, 8))
    return buf


@pytest.mark.parametrize("name, kind, call, exc", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_arguments_raise_library_errors_and_change_nothing(
        name: str, kind: str, call: Any, exc: type[Exception]) -> None:
    """Issue 9: every public entry point of the pytorchrl front end, given None,
    strings, NaN, wrong shapes or kinds, tensors of the wrong size or non-positive
    counts, raises a library error naming the problem and leaves the storage as it
    was (a first insert that fails leaves it unbuilt)."""
    buf = hostile_storage(kind)
    rejects(buf, call, exc)
    if kind == FRESH:
        assert buf.buffer is None and buf.num_envs == 0


BAD_CONSTRUCTORS: list[tuple[str, Any, type[Exception]]] = [
    ("size=None", lambda: ReplayBuffer(None, "cpu", ACTOR, ALGO, None), ArgumentError),
    ("size='x'", lambda: ReplayBuffer("x", "cpu", ACTOR, ALGO, None), ArgumentError),
    ("size=0", lambda: ReplayBuffer(0, "cpu", ACTOR, ALGO, None), ConfigError),
    ("size=2.5", lambda: ReplayBuffer(2.5, "cpu", ACTOR, ALGO, None), ArgumentError),
    ("seed='x'", lambda: ReplayBuffer(10, "cpu", ACTOR, ALGO, None, seed="x"), ConfigError),
    ("seed=-1", lambda: ReplayBuffer(10, "cpu", ACTOR, ALGO, None, seed=-1), ConfigError),
    ("device='bogus'", lambda: ReplayBuffer(10, "bogus", ACTOR, ALGO, None), ConfigError),
    ("gamma=nan", lambda: ReplayBuffer(10, "cpu", ACTOR, SimpleNamespace(gamma=NAN), None),
     ConfigError),
    ("gamma='x'", lambda: ReplayBuffer(10, "cpu", ACTOR, SimpleNamespace(gamma="x"), None),
     ArgumentError),
    ("gamma=2", lambda: ReplayBuffer(10, "cpu", ACTOR, SimpleNamespace(gamma=2.0), None),
     ConfigError),
    ("recurrent, algorithm=None",
     lambda: ReplayBuffer(10, "cpu", SimpleNamespace(is_recurrent=True, sequence_overlap=0.5),
                          None, None), ArgumentError),
    ("sequence_overlap=1",
     lambda: ReplayBuffer(10, "cpu", SimpleNamespace(is_recurrent=True, sequence_overlap=1.0),
                          ALGO, None), ConfigError),
    ("sequence_overlap=nan",
     lambda: ReplayBuffer(10, "cpu", SimpleNamespace(is_recurrent=True, sequence_overlap=NAN),
                          ALGO, None), ConfigError),
    ("n_step=None", lambda: NStepReplayBuffer(10, "cpu", ACTOR, ALGO, None, n_step=None),
     ArgumentError),
    ("n_step='x'", lambda: NStepReplayBuffer(10, "cpu", ACTOR, ALGO, None, n_step="x"),
     ArgumentError),
    ("n_step=2.5", lambda: NStepReplayBuffer(10, "cpu", ACTOR, ALGO, None, n_step=2.5),
     ArgumentError),
    ("n_step=nan", lambda: NStepReplayBuffer(10, "cpu", ACTOR, ALGO, None, n_step=NAN),
     ArgumentError),
    ("n_step=0", lambda: NStepReplayBuffer(10, "cpu", ACTOR, ALGO, None, n_step=0),
     ConfigError),
    ("alpha=nan", lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, alpha=NAN), ConfigError),
    ("alpha=-1", lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, alpha=-1.0), ConfigError),
    ("alpha='x'", lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, alpha="x"), ArgumentError),
    ("alpha=None", lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, alpha=None),
     ArgumentError),
    ("beta=nan (PER off)", lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, beta=NAN),
     ConfigError),
    ("beta=-0.1", lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, beta=-0.1), ConfigError),
    ("epsilon=nan", lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, epsilon=NAN),
     ConfigError),
    ("epsilon=-1", lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, epsilon=-1.0),
     ConfigError),
    ("default_error=nan",
     lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, default_error=NAN), ConfigError),
    ("default_error=-1", lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, default_error=-1),
     ConfigError),
    ("default_error='x'",
     lambda: PERBuffer(10, "cpu", ACTOR, ALGO, None, default_error="x"), ArgumentError),
    ("eta=nan", lambda: EREBuffer(10, "cpu", ACTOR, ALGO, None, eta=NAN), ConfigError),
    ("eta=0", lambda: EREBuffer(10, "cpu", ACTOR, ALGO, None, eta=0.0), ConfigError),
    ("eta='x'", lambda: EREBuffer(10, "cpu", ACTOR, ALGO, None, eta="x"), ArgumentError),
    ("cmin=0", lambda: EREBuffer(10, "cpu", ACTOR, ALGO, None, cmin=0), ConfigError),
    ("cmin='x'", lambda: EREBuffer(10, "cpu", ACTOR, ALGO, None, cmin="x"), ArgumentError),
    ("cmin=None", lambda: EREBuffer(10, "cpu", ACTOR, ALGO, None, cmin=None), ArgumentError),
    ("her_function=None",
     lambda: HERBuffer(10, "cpu", ACTOR, ALGO, None, her_function=None), ArgumentError),
    ("ReplayBuffer.create_factory(0)", lambda: ReplayBuffer.create_factory(0), ConfigError),
    ("NStepReplayBuffer.create_factory(n_step='x')",
     lambda: NStepReplayBuffer.create_factory(10, n_step="x"), ArgumentError),
    ("EREBuffer.create_factory(eta=2)", lambda: EREBuffer.create_factory(10, eta=2.0),
     ConfigError),
    ("HERBuffer.create_factory(her_function=5)",
     lambda: HERBuffer.create_factory(10, her_function=5), ArgumentError),
]


@pytest.mark.parametrize("name, make, exc", BAD_CONSTRUCTORS,
                         ids=[c[0] for c in BAD_CONSTRUCTORS])
def test_hostile_constructor_arguments_raise_library_errors(
        name: str, make: Any, exc: type[Exception]) -> None:
    """Issue 9/10: constructors and factories check every argument now, naming it."""
    with pytest.raises(exc) as info:
        make()
    assert isinstance(info.value, ReplayBankError)
    assert name.split("=")[0].split("(")[-1].split(",")[0].strip() in str(info.value) \
        or "her_function" in str(info.value) or "update_every" in str(info.value)


def test_insert_data_slice_is_one_write() -> None:
    """insert_data_slice writes all its rows or none (a bad later row adds nothing), and
    a slice gives the same stored rows, priorities and HER copies as the same rows
    inserted one by one."""
    for make in (lambda: per_filled(), lambda: her_filled()):
        a, b = make(), make()
        src = ReplayBuffer(40, "cpu", ACTOR, ALGO, None)
        fill(src, 12, ends={0: [7, 10], 1: [9]})
        data = src.data
        a.insert_data_slice(data)
        for i in range(12):  # the hidden states of a feed-forward actor: one zero row
            b.insert_transition({k: v[i] for k, v in data.items()
                                 if v is not None and k not in (RHS, RHS2)})
        assert (a.size, a.step) == (b.size, b.step) == (make().size + 12,) * 2
        for key, v in a.data.items():
            if v is not None:
                np.testing.assert_array_equal(v, b.data[key])
        assert getattr(a, "relabelled", 0) == getattr(b, "relabelled", 0)
        x, y = next(a.generate_batches(1, 256)), next(b.generate_batches(1, 256))
        for key in (OBS, ACT, REW, OBS2, DONE2, "per_weights", "n_step"):
            if isinstance(x.get(key), torch.Tensor):
                torch.testing.assert_close(x[key], y[key])
    bad = {**data, DONE2: np.where(np.arange(12)[:, None, None] == 9, 0.5, data[DONE2])}
    rejects(per_filled(), lambda b: b.insert_data_slice(bad), DtypeError)


def test_update_storage_parameter_default_error() -> None:
    """update_storage_parameter('default_error', v) applies to the next steps (it raised
    AttributeError on the read-only property)."""
    buf = per_filled()
    buf.update_storage_parameter("default_error", 5.0)
    assert buf.default_error == 5.0 and buf.error == 5.0
    fill(buf, 1)


def _with_extras(t: int, **over: Any) -> dict[str, Any]:
    """A transition carrying the optional storage tensors too."""
    return good_transition(t, **{IREW: torch.zeros(2, 1), ACTPROBS: torch.zeros(2, 4),
                                 **over})


# a value that fits the leading dims [num_envs] but not the stored field
WRONG_FIELD = [
    (OBS, torch.zeros(2, 4), ShapeError),
    (OBS2, torch.zeros(2, 4), ShapeError),
    (ACT, torch.zeros(2, 2), ShapeError),
    (DONE, torch.zeros(2, 2), ShapeError),
    (IREW, torch.zeros(2, 3), ShapeError),
    (ACTPROBS, torch.zeros(2, 5), ShapeError),
    (OBS, torch.zeros(2, 3, dtype=torch.complex64), DtypeError),
    (ACT, torch.zeros(2, 1, dtype=torch.complex64), DtypeError),
    (REW, torch.zeros(2, 1, dtype=torch.complex64), DtypeError),
]


@pytest.mark.parametrize("key, bad, exc", WRONG_FIELD,
                         ids=[f"{k}-{tuple(v.shape)}-{v.dtype}" for k, v, _ in WRONG_FIELD])
def test_refused_values_are_named_by_pytorchrl_key(key: str, bad: Any,
                                                   exc: type[Exception]) -> None:
    """A value of the wrong field shape or dtype was refused by the core under its own
    field name (``obs=array(...)``, ``irew``, ``prev_done``, ``act_probs``), which a
    pytorchrl user never wrote; the message names ``sample['<pytorchrl key>']`` now, for
    insert_transition, insert_data_slice and a HER storage, and nothing changes."""
    for cls in (ReplayBuffer, HERBuffer):
        buf = cls(40, "cpu", ACTOR, ALGO, None, seed=0)
        for t in range(3):
            buf.insert_transition(_with_extras(t))
        message = rejects(buf, lambda b: b.insert_transition(_with_extras(9, **{key: bad})),
                          exc)
        assert f"{cls.__name__}.insert_transition: sample[{key!r}]" in message, message
        rows = {k: v if v is None or k == key else v[:2] for k, v in buf.data.items()}
        rows[key] = torch.stack([bad, bad])
        message = rejects(buf, lambda b, rows=rows: b.insert_data_slice(rows), exc)
        assert f"{cls.__name__}.insert_data_slice: sample[{key!r}]" in message, message


def test_refused_dict_observation_entries_are_named() -> None:
    """A dict observation entry of the wrong shape was named ``obs/pos``, a missing entry
    by the core's field list (``missing ['obs/vel']; ... plus next_obs``); both name
    ``sample['Observation']`` (and the entry) now."""
    def step(t: int, shape: tuple[int, ...] = (3,), keys: tuple[str, ...] = ("pos", "vel"),
             ) -> dict[str, Any]:
        s = transition(t)
        s[OBS] = {k: torch.full((2, *shape), float(t)) for k in keys}
        s[OBS2] = {k: torch.full((2, *shape), float(t + 1)) for k in keys}
        return s

    buf = ReplayBuffer(10, "cpu", ACTOR, ALGO, None)
    buf.insert_transition(step(0))
    message = rejects(buf, lambda b: b.insert_transition(step(1, shape=(4,))), ShapeError)
    assert "sample['Observation']['pos']=array(shape=(2, 4)" in message, message
    message = rejects(buf, lambda b: b.insert_transition(step(1, keys=("pos",))), SpecError)
    assert "sample['Observation'] has the entries ['pos']" in message, message
    assert "['pos', 'vel']" in message


def test_complex_first_transition_is_refused() -> None:
    """A complex value in the first transition was stored as complex (the core infers the
    field from it) and every batch and export then dropped its imaginary part with only
    a warning; it is refused now, naming the key, and the storage stays unbuilt."""
    for key in (OBS, REW, IREW):
        buf = ReplayBuffer(10, "cpu", ACTOR, ALGO, None)
        bad = _with_extras(0)
        bad[key] = bad[key].to(torch.complex64) + 1j
        with pytest.raises(DtypeError, match=rf"insert_transition: sample\['{key}'\]"):
            buf.insert_transition(bad)
        assert buf.buffer is None and buf.size == 0
        buf.insert_transition(_with_extras(0))  # a good one still builds it
        assert buf.size == 1


def test_all_zero_priorities_error_speaks_pytorchrl() -> None:
    """With pytorchrl's default epsilon=0.0, TD errors of 0 give priority 0; once every
    stored step has it, the core refused with its own terms (``sample(batch_size=16):
    ... use eps > 0``). The error names generate_batches, mini_batch_size and epsilon
    now, and says how to fix it."""
    for cls in (PERBuffer, EREBuffer):
        buf = cls(10, "cpu", ACTOR, ALGO, None, alpha=0.6, epsilon=0.0, seed=0)
        fill(buf, 4, n=1)
        with pytest.raises(EmptyBufferError) as info:
            for _ in range(100):  # zero the priority of every step drawn, until none is left
                for batch in buf.generate_batches(1, 16):
                    buf.after_gradients(batch, {"Algorithm": {"errors": torch.zeros(16, 1)}})
        message = str(info.value)
        assert message.startswith(f"{cls.__name__}.generate_batches(mini_batch_size=16): "
                                  "every stored step has priority 0"), message
        assert "epsilon=0.0" in message and "epsilon=1e-6" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_generate_batches_on_a_missing_cuda_device_is_a_config_error() -> None:
    """A storage built for device='cuda' (a factory's worker device) on a machine without
    CUDA made generate_batches fail inside torch with a bare ``AssertionError: Torch not
    compiled with CUDA enabled``. It raises a ConfigError naming the device at the call
    now, and update_storage_parameter('device', 'cpu') is the fix."""
    buf = PERBuffer(10, "cuda", ACTOR, ALGO, None, alpha=0.6, seed=0)
    fill(buf, 3)
    message = rejects(buf, lambda b: b.generate_batches(1, 4), ConfigError)
    assert "PERBuffer(device='cuda'): CUDA is not available on this machine" in message
    buf.update_storage_parameter("device", "cpu")
    assert next(buf.generate_batches(1, 4))[OBS].device.type == "cpu"


def test_generate_batches_yields_num_mini_batch_per_epoch() -> None:
    """The reference documents ``num_mini_batch`` as "Number mini batches per epoch" and
    ``num_epochs`` as "Number of epochs"; ``num_epochs`` was ignored (2 batches for
    ``generate_batches(2, 4, num_epochs=3)``). It yields ``num_epochs * num_mini_batch``
    batches now, and ERE's window schedule (mini batch k of K) runs over each epoch."""
    for cls in (ReplayBuffer, NStepReplayBuffer, PERBuffer, HERBuffer):
        buf = cls(100, "cpu", ACTOR, ALGO, None, seed=0)
        fill(buf, 30)
        assert len(list(buf.generate_batches(2, 4, num_epochs=3))) == 6
        assert len(list(buf.generate_batches(2, 4))) == 2  # the default: one epoch
    ere = EREBuffer(100, "cpu", ACTOR, ALGO, None, eta=0.999, cmin=4, seed=0)
    fill(ere, 30)
    cks = [b["ck"] for b in ere.generate_batches(3, 4, num_epochs=2)]
    assert cks[:3] == cks[3:] and cks[0] > cks[1] > cks[2], cks
    recurrent = ReplayBuffer(100, "cpu", SimpleNamespace(is_recurrent=True,
                                                         sequence_overlap=0.5), ALGO, None)
    for t in range(16):
        recurrent.insert_transition(transition(t))
    assert len(list(recurrent.generate_batches(1, 4, num_epochs=4))) == 4
