"""replaybank.compat.src: the ``src.buffers`` front end, section by section of its reference.

Each test names the section of the reference document (``src.buffers`` package) it checks.
GAE and rewards-to-go are checked against plain loops; a CartPole PPO loop written in the
original project's style runs with only its import changed; configs come from real files.
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank.compat.src as src
from replaybank.errors import (
    ArgumentError,
    CapacityError,
    ConfigError,
    EmptyBufferError,
    ShapeError,
)

torch = pytest.importorskip("torch")


@dataclass
class ActionSample:
    """The project's ``src.utils.utils.ActionSample``: what ``select_action`` returns."""

    action: Any = None
    value: Any = None
    logp: Any = None


# ---------------------------------------------------------------------- oracles
def oracle_path(rews: list[float], vals: list[float], last_val: float, gamma: float,
                lam: float) -> tuple[list[float], list[float]]:
    """GAE-lambda advantages and rewards-to-go of one path, as plain loops."""
    r = [*rews, last_val]
    v = [*vals, last_val]
    n = len(rews)
    deltas = [r[t] + gamma * v[t + 1] - v[t] for t in range(n)]
    adv = [0.0] * n
    running = 0.0
    for t in reversed(range(n)):
        running = deltas[t] + gamma * lam * running
        adv[t] = running
    ret = [0.0] * (n + 1)
    running = 0.0
    for t in reversed(range(n + 1)):
        running = r[t] + gamma * running
        ret[t] = running
    return adv, ret[:-1]


def normalise(x: list[float], eps: float) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    return (a - a.mean()) / (a.std() + eps)


def fill(buf: src.PPOBuffer, rng: np.random.Generator, lengths: list[int],
         terminal: list[bool]) -> tuple[list[float], list[float]]:
    """Store paths whose obs[0] is the global step number; return oracle adv / ret."""
    advs: list[float] = []
    rets: list[float] = []
    step = 0
    for length, term in zip(lengths, terminal, strict=True):
        rews = rng.normal(size=length).astype(np.float32).tolist()
        vals = rng.normal(size=length).astype(np.float32).tolist()
        for t in range(length):
            obs = np.array([step, t], np.float32)[: buf.obs_dim]
            buf.store({"obs": obs, "rew": rews[t],
                       "act": ActionSample(np.full(buf.act_dim, 0.5), vals[t], -1.0)})
            step += 1
        last = 0.0 if term else float(np.float32(rng.normal()))
        buf.finish_path(None if term else ActionSample(value=last))
        a, r = oracle_path(rews, vals, last, buf.gamma, buf.lam)
        advs += a
        rets += r
    return advs, rets


def whole_epoch(buf: src.PPOBuffer, n: int) -> dict[str, np.ndarray]:
    """sample_batch(): all ``n`` steps of the epoch, in step order."""
    out = {k: v.numpy() for k, v in buf.sample_batch().items()}
    assert len(out["obs"]) == n
    np.testing.assert_array_equal(out["obs"][:, 0], np.arange(n))
    return out


# ---------------------------------------------------------------------- Module contents
def test_module_contents_exports_every_documented_name() -> None:
    """Section 'Module contents' / 'Submodules': PPOBuffer, discount_cumsum,
    SimpleReplayBuffer, plus the issue's module-level config functions."""
    for name in ("PPOBuffer", "SimpleReplayBuffer", "discount_cumsum",
                 "instantiate_from_config", "instantiate_from_config_dict"):
        assert name in src.__all__
        assert getattr(src, name) is not None
    assert sorted(src.__all__) == sorted(set(src.__all__))
    public = {n for n in vars(src) if not n.startswith("_") and
              getattr(getattr(src, n), "__module__", None) == src.__name__}
    assert public == set(src.__all__)


# ---------------------------------------------------------------------- PPOBuffer class
def test_ppobuffer_signature_and_defaults() -> None:
    """Section 'class PPOBuffer(obs_dim, act_dim, size, batch_size, gamma=0.99, lam=0.95,
    eps=0.001)'."""
    params = inspect.signature(src.PPOBuffer).parameters
    assert list(params)[:7] == ["obs_dim", "act_dim", "size", "batch_size", "gamma", "lam",
                                "eps"]
    assert (params["gamma"].default, params["lam"].default, params["eps"].default) == \
        (0.99, 0.95, 1e-3)
    buf = src.PPOBuffer(4, 2, 100, 32)
    assert (buf.obs_dim, buf.act_dim, buf.size, buf.batch_size) == (4, 2, 100, 32)
    assert (buf.gamma, buf.lam, buf.eps) == (0.99, 0.95, 1e-3)
    assert (buf.path.gamma, buf.path.lam, buf.path.eps, buf.path.max_size) == \
        (0.99, 0.95, 1e-3, 100)
    assert "PPOBuffer(obs_dim=4" in repr(buf)


@pytest.mark.parametrize("kwargs,key", [
    ({"obs_dim": 0}, "obs_dim"), ({"act_dim": 1.5}, "act_dim"), ({"size": -3}, "size"),
    ({"batch_size": True}, "batch_size"), ({"gamma": 1.2}, "gamma"), ({"lam": -0.1}, "lam"),
    ({"eps": -1e-3}, "eps"), ({"gamma": float("nan")}, "gamma")])
def test_ppobuffer_constructor_errors_name_the_argument(kwargs: dict[str, Any],
                                                        key: str) -> None:
    """Section 'class PPOBuffer' (Parameters): a bad argument is a ConfigError naming it."""
    args = {"obs_dim": 4, "act_dim": 1, "size": 10, "batch_size": 5, **kwargs}
    with pytest.raises(ConfigError, match=rf"{key}=.*e\.g\. {key}: "):
        src.PPOBuffer(**args)


# ---------------------------------------------------------------------- PPOBuffer.store
def test_store_appends_one_timestep_from_buffer_dict() -> None:
    """Section 'store(buffer_dict)': obs, act (.action/.value/.logp), rew; other keys of
    the runner's dict (next_obs, done) are ignored; torch tensors are detached."""
    buf = src.PPOBuffer(3, 2, 5, 5)
    obs = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)  # [1, obs_dim] from a net
    act = ActionSample(torch.tensor([0.1, 0.2]), torch.tensor([0.7]), torch.tensor(-0.3))
    buf.store({"obs": obs, "act": act, "rew": 1.5, "next_obs": obs, "done": False})
    buf.store({"obs": np.zeros(3), "act": ActionSample([1, 2], 0.0, 0.0), "rew": np.float64(2)})
    assert len(buf) == 2
    data = buf.path.rollout.data
    np.testing.assert_allclose(data["obs"][:2, 0], [[1, 2, 3], [0, 0, 0]])
    np.testing.assert_allclose(data["action"][:2, 0], [[0.1, 0.2], [1, 2]], rtol=1e-6)
    np.testing.assert_allclose(data["value"][:2, 0], [0.7, 0.0])
    np.testing.assert_allclose(data["log_prob"][:2, 0], [-0.3, 0.0])
    np.testing.assert_allclose(data["reward"][:2, 0], [1.5, 2.0])
    assert data["obs"].dtype == np.float32 and data["action"].dtype == np.float32


def test_store_errors() -> None:
    """Section 'store(buffer_dict)': missing keys, a non-ActionSample, wrong sizes and an
    overfull epoch raise errors naming the key and the fix; nothing is stored."""
    buf = src.PPOBuffer(3, 1, 2, 2)
    ok = ActionSample(0, 0.0, 0.0)
    with pytest.raises(ArgumentError, match=r"missing key 'rew'"):
        buf.store({"obs": np.zeros(3), "act": ok})
    with pytest.raises(ArgumentError, match=r"has no \.value, \.logp"):
        buf.store({"obs": np.zeros(3), "act": type("A", (), {"action": 0})(), "rew": 0})
    with pytest.raises(ArgumentError, match=r"has no \.logp"):
        buf.store({"obs": np.zeros(3), "act": type("A", (), {"action": 0, "value": 0})(),
                   "rew": 0})
    with pytest.raises(ShapeError, match=r"buffer_dict\['obs'\].*expected 3 values"):
        buf.store({"obs": np.zeros(4), "act": ok, "rew": 0})
    with pytest.raises(ShapeError, match=r"buffer_dict\['act'\]\.action.*expected 1 values"):
        buf.store({"obs": np.zeros(3), "act": ActionSample([1, 2], 0, 0), "rew": 0})
    with pytest.raises(ShapeError, match=r"buffer_dict\['rew'\].*one number"):
        buf.store({"obs": np.zeros(3), "act": ok, "rew": [1, 2]})
    assert len(buf) == 0
    for _ in range(2):
        buf.store({"obs": np.zeros(3), "act": ok, "rew": 0})
    with pytest.raises(CapacityError, match=r"epoch is full \(size=2 steps\).*sample_batch"):
        buf.store({"obs": np.zeros(3), "act": ok, "rew": 0})


# ---------------------------------------------------------------------- PPOBuffer.finish_path
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.8, 0.0), (1.0, 1.0)])
def test_finish_path_matches_plain_loop_gae(gamma: float, lam: float) -> None:
    """Section 'finish_path(action_obj=None)': GAE-lambda advantages and rewards-to-go per
    path; last_val = 0 for a terminated path (action_obj None), V(s_T) = action_obj.value
    for a cut one."""
    rng = np.random.default_rng(0)
    buf = src.PPOBuffer(2, 1, 30, 30, gamma=gamma, lam=lam)
    advs, rets = fill(buf, rng, [7, 1, 12, 5], [True, False, True, False])
    np.testing.assert_allclose(buf.path.advantages, advs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(buf.path.returns_to_go, rets, rtol=1e-5, atol=1e-5)


def test_finish_path_action_obj_forms() -> None:
    """Section 'finish_path(action_obj=None)': None means terminal (0), an ActionSample's
    .value (tensor or number) or a plain number bootstraps; an empty path is a no-op."""
    for obj, last in [(None, 0.0), (ActionSample(value=torch.tensor([2.0])), 2.0),
                      (ActionSample(value=np.float32(2.0)), 2.0), (2.0, 2.0)]:
        buf = src.PPOBuffer(1, 1, 4, 4, gamma=0.5, lam=1.0)
        buf.finish_path(obj)  # empty path: nothing happens
        buf.store({"obs": np.zeros(1), "act": ActionSample(0, 0.0, 0.0), "rew": 1.0})
        buf.finish_path(obj)
        assert buf.path.returns_to_go.tolist() == [1.0 + 0.5 * last]
    with pytest.raises(ArgumentError, match=r"finish_path\(action_obj=.*\.value is V\(s_T\)"):
        buf.finish_path("last")
    buf.store({"obs": np.zeros(1), "act": ActionSample(0, 0.0, 0.0), "rew": 1.0})
    with pytest.raises(ConfigError, match="finite"):
        buf.finish_path(ActionSample(value=float("inf")))


def test_finish_path_default_is_none_and_means_terminal() -> None:
    """Sections 'finish_path(action_obj=None)' of both classes: the parameter defaults to
    None; PPOBuffer.finish_path() with no argument closes the path with last_val 0 (the
    docstring's value for a terminal state), exactly as finish_path(None)."""
    for cls in (src.PPOBuffer, src.SimpleReplayBuffer):
        param = inspect.signature(cls.finish_path).parameters["action_obj"]
        assert param.default is None, cls.__name__
    bufs = [src.PPOBuffer(1, 1, 4, 4, gamma=0.5, lam=1.0) for _ in range(2)]
    for buf in bufs:
        for r in (1.0, 2.0):
            buf.store({"obs": np.zeros(1), "act": ActionSample(0, 0.0, 0.0), "rew": r})
    bufs[0].finish_path()
    bufs[1].finish_path(None)
    assert bufs[0].path.returns_to_go.tolist() == [2.0, 2.0]
    assert bufs[0].path.returns_to_go.tolist() == bufs[1].path.returns_to_go.tolist()


def test_instantiate_classmethods_return_the_calling_class(tmp_path: Path) -> None:
    """Sections 'classmethod instantiate_from_config(config_file_location)' and
    'instantiate_from_config_dict(config)' (return type cls): both are classmethods, and
    called on a subclass they build that subclass."""
    path = tmp_path / "c.yaml"
    path.write_text("obs_dim: 3\nact_dim: 1\nsize: 16\nbatch_size: 4\n")
    for base in (src.PPOBuffer, src.SimpleReplayBuffer):
        for name in ("instantiate_from_config", "instantiate_from_config_dict"):
            assert isinstance(inspect.getattr_static(base, name), classmethod), name
        sub = type("My" + base.__name__, (base,), {})
        built = [
            sub.instantiate_from_config(path),
            sub.instantiate_from_config_dict(
                {"obs_dim": 3, "act_dim": 1, "size": 16, "batch_size": 4}
            ),
        ]
        for buf in built:
            assert type(buf) is sub and (buf.obs_dim, buf.size) == (3, 16)


# ---------------------------------------------------------------------- PPOBuffer.sample_batch
def test_sample_batch_dtypes_and_a_new_epoch_after_it() -> None:
    """Section 'sample_batch()': float32 CPU tensors; "resets some pointers": the next
    store starts a new epoch, and the next call returns that epoch alone."""
    buf = src.PPOBuffer(2, 2, 50, 16, gamma=0.95, lam=0.9)
    fill(buf, np.random.default_rng(1), [10, 20, 13, 7], [True, False, False, True])
    first = buf.sample_batch()
    assert {k: tuple(v.shape) for k, v in first.items()} == {
        "obs": (50, 2), "act": (50, 2), "ret": (50,), "adv": (50,), "logp": (50,)}
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for v in first.values())
    assert abs(float(first["adv"].mean())) < 1e-5
    assert abs(float(first["adv"].std(False)) - 1) < 1e-3
    np.testing.assert_allclose(first["act"], 0.5)
    np.testing.assert_allclose(first["logp"], -1.0)
    assert len(buf) == 0
    first["adv"].zero_()  # the caller's tensors: the next call's are fresh
    assert float(buf.sample_batch()["adv"].abs().sum()) > 0
    fill(buf, np.random.default_rng(1), [3], [False])  # a new epoch of 3 steps
    assert buf.sample_batch()["obs"][:, 0].tolist() == [0.0, 1.0, 2.0]


def test_sample_batch_errors() -> None:
    """Section 'sample_batch()': an empty buffer and an unfinished trajectory raise
    EmptyBufferError saying to call finish_path; the buffer is unchanged."""
    buf = src.PPOBuffer(2, 1, 8, 4)
    with pytest.raises(EmptyBufferError, match="empty"):
        buf.sample_batch()
    buf.store({"obs": np.zeros(2), "act": ActionSample(0, 0.0, 0.0), "rew": 1.0})
    with pytest.raises(EmptyBufferError, match=r"steps 0\.\.0 .*unfinished.*finish_path"):
        buf.sample_batch()
    assert len(buf) == 1
    buf.finish_path(None)
    assert len(buf.sample_batch()["obs"]) == 1


def test_sample_batch_device_keyword() -> None:
    """Section 'sample_batch()': batches are CPU tensors by default; device= moves them."""
    buf = src.PPOBuffer(2, 1, 8, 4, device="cpu")
    fill(buf, np.random.default_rng(0), [5], [True])
    assert buf.sample_batch()["obs"].device.type == "cpu"


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
       gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0), bs=st.integers(1, 12),
       data=st.data())
def test_epochs_match_the_oracle_for_any_paths(lengths: list[int], gamma: float, lam: float,
                                               bs: int, data: st.DataObject) -> None:
    """Sections 'finish_path' + 'sample_batch' (property): any path lengths, terminal or
    cut, any batch_size: one pass equals the plain-loop oracle."""
    terminal = data.draw(st.lists(st.booleans(), min_size=len(lengths),
                                  max_size=len(lengths)))
    buf = src.PPOBuffer(2, 1, sum(lengths), bs, gamma=gamma, lam=lam, eps=1e-3)
    advs, rets = fill(buf, np.random.default_rng(len(lengths)), lengths, terminal)
    epoch = whole_epoch(buf, sum(lengths))
    np.testing.assert_allclose(epoch["ret"], rets, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(epoch["adv"], normalise(advs, 1e-3), rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------------- discount_cumsum
def test_discount_cumsum_matches_loop() -> None:
    """Section 'discount_cumsum(x, discount)': y[t] = sum_k discount^k x[t+k]."""
    x = np.random.default_rng(0).normal(size=17)
    want = [sum(0.9 ** k * x[t + k] for k in range(len(x) - t)) for t in range(len(x))]
    np.testing.assert_allclose(src.discount_cumsum(x, 0.9), want, rtol=1e-12)
    assert src.discount_cumsum([1.0, 1.0], 0.0).tolist() == [1.0, 1.0]
    with pytest.raises(ConfigError, match="discount"):
        src.discount_cumsum([1.0], float("nan"))


# ---------------------------------------------------------------------- schema
def test_schema_attributes() -> None:
    """Sections 'PPOBuffer.schema' and 'SimpleReplayBuffer.schema', as the pydantic models
    beside the strictyaml Maps (config_model): four required ints; PPO adds optional
    floats gamma, lam, eps (defaults as the constructor)."""
    ppo = src.PPOBuffer.config_model.model_fields
    assert [k for k, f in ppo.items() if f.is_required()] == ["obs_dim", "act_dim", "size",
                                                             "batch_size"]
    assert {k: ppo[k].default for k in ("gamma", "lam", "eps")} == \
        {"gamma": 0.99, "lam": 0.95, "eps": 1e-3}
    assert list(src.SimpleReplayBuffer.config_model.model_fields) == [
        "obs_dim", "act_dim", "size", "batch_size"]
    # Float() takes ints and YAML's 1e-3 string; Int() takes no floats or bools
    cfg = src.PPOBufferConfig(obs_dim=np.int64(3), act_dim=1, size=8, batch_size=2, gamma=1,
                              eps="1e-3")
    assert (cfg.obs_dim, cfg.gamma, cfg.eps) == (3, 1.0, 1e-3)


@pytest.mark.parametrize("config,message", [
    ({"obs_dim": 4, "act_dim": 1, "size": 10}, r"missing required key 'batch_size'; add e\.g\."
                                              r" batch_size: 64"),
    ({"obs_dim": 4, "act_dim": 1, "size": 10, "batch_size": 2, "lamda": 0.9},
     r"unknown key 'lamda' \(value 0\.9\); did you mean 'lam'\? allowed keys: \['obs_dim'"),
    ({"obs_dim": "four", "act_dim": 1, "size": 10, "batch_size": 2},
     r"obs_dim='four': must be an int >= 1; e\.g\. obs_dim: 4"),
    ({"obs_dim": 4, "act_dim": 1, "size": 10.0, "batch_size": 2},
     r"size=10\.0: must be an int >= 1"),
    ({"obs_dim": 4, "act_dim": 1, "size": 10, "batch_size": 2, "gamma": "high"},
     r"gamma='high': must be a number; e\.g\. gamma: 0\.99"),
    ({"obs_dim": 4, "act_dim": 1, "size": 10, "batch_size": 2, "eps": True},
     r"eps=True: must be a finite number"),
    ([1, 2], r"config=\[1, 2\]: expected a mapping"),
])
def test_schema_errors_name_key_value_and_fix(config: Any, message: str) -> None:
    """Section 'schema' + 'instantiate_from_config_dict': validation errors are
    ConfigError (a ValueError) naming the key, the value, the rule and an example."""
    with pytest.raises(ConfigError, match=r"PPOBuffer config: " + message
                       if isinstance(config, dict) else message) as info:
        src.PPOBuffer.instantiate_from_config_dict(config)
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------------- instantiate_*
def test_instantiate_from_config_dict_classmethods() -> None:
    """Sections 'instantiate_from_config_dict(config)' of both classes: a mapping of the
    class's arguments (defaults filled in); a config naming the other type is refused."""
    ppo = src.PPOBuffer.instantiate_from_config_dict(
        {"obs_dim": 4, "act_dim": 2, "size": 64, "batch_size": 16, "gamma": 0.9})
    assert isinstance(ppo, src.PPOBuffer)
    assert (ppo.obs_dim, ppo.act_dim, ppo.size, ppo.batch_size, ppo.gamma, ppo.lam,
            ppo.eps) == (4, 2, 64, 16, 0.9, 0.95, 1e-3)
    sac = src.SimpleReplayBuffer.instantiate_from_config_dict(
        {"name": "SimpleReplayBuffer", "config": {"obs_dim": 4, "act_dim": 2, "size": 64,
                                                  "batch_size": 16}})
    assert isinstance(sac, src.SimpleReplayBuffer) and sac.size == 64
    with pytest.raises(ConfigError, match=r"unknown key 'gamma'.*allowed keys"):
        src.SimpleReplayBuffer.instantiate_from_config_dict(
            {"obs_dim": 4, "act_dim": 2, "size": 64, "batch_size": 16, "gamma": 0.9})
    with pytest.raises(ConfigError, match=r"names type 'PPOBuffer', not 'SimpleReplayBuffer'"):
        src.SimpleReplayBuffer.instantiate_from_config_dict({"type": "PPOBuffer"})


def test_instantiate_from_config_files(tmp_path: Path) -> None:
    """Sections 'instantiate_from_config(config_file_location)' of both classes, and the
    module functions: YAML and JSON files on disk."""
    ppo_yaml = tmp_path / "ppo.yaml"
    ppo_yaml.write_text("obs_dim: 4\nact_dim: 1\nsize: 2000\nbatch_size: 128\n"
                        "gamma: 0.98\nlam: 0.9\neps: 1e-3\n")
    buf = src.PPOBuffer.instantiate_from_config(ppo_yaml)
    assert (buf.size, buf.batch_size, buf.gamma, buf.lam, buf.eps) == (2000, 128, 0.98, 0.9,
                                                                       1e-3)
    assert src.PPOBuffer.instantiate_from_config(str(ppo_yaml)).size == 2000
    nested = tmp_path / "agent_buffer.yml"
    nested.write_text("name: SimpleReplayBuffer\nconfig:\n  obs_dim: 33\n  act_dim: 2\n"
                      "  size: 250000\n  batch_size: 256\n")
    sac = src.instantiate_from_config(nested)
    assert isinstance(sac, src.SimpleReplayBuffer)
    assert (sac.obs_dim, sac.act_dim, sac.size, sac.batch_size) == (33, 2, 250000, 256)
    js = tmp_path / "ppo.json"
    js.write_text(json.dumps({"type": "PPOBuffer", "obs_dim": 8, "act_dim": 2, "size": 16,
                              "batch_size": 4}))
    assert isinstance(src.instantiate_from_config(js), src.PPOBuffer)
    assert src.PPOBuffer.instantiate_from_config(js).obs_dim == 8


def test_instantiate_from_config_errors(tmp_path: Path) -> None:
    """Section 'instantiate_from_config' (Raises: ValueError - Error loading file): missing
    files, unparsable files, bad keys in files and unknown or absent type names."""
    with pytest.raises(ValueError, match=r"cannot read it"):
        src.PPOBuffer.instantiate_from_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("obs_dim: [4\nact_dim: 1\n")
    with pytest.raises(ValueError, match=r"broken\.yaml'?: cannot parse it"):
        src.PPOBuffer.instantiate_from_config(broken)
    bad = tmp_path / "bad.yaml"
    bad.write_text("obs_dim: 4\nact_dim: 1\nsize: 0\nbatch_size: 8\n")
    with pytest.raises(ConfigError, match=r"size=0: must be an int >= 1; e\.g\. size: 4000"):
        src.PPOBuffer.instantiate_from_config(bad)
    with pytest.raises(ConfigError, match=r"config_file_location=12: expected a path"):
        src.instantiate_from_config(12)
    with pytest.raises(ConfigError, match=r"names no buffer type.*'name'"):
        src.instantiate_from_config(bad)
    with pytest.raises(ConfigError, match=r"buffer type 'DQNBuffer': unknown; known types: "
                                          r"\['PPOBuffer', 'SimpleReplayBuffer'\]"):
        src.instantiate_from_config_dict({"name": "DQNBuffer", "config": {}})
    with pytest.raises(ConfigError, match=r"config keys \['size'\].*move the others"):
        src.instantiate_from_config_dict({"name": "PPOBuffer", "config": {}, "size": 3})


# ---------------------------------------------------------------------- SimpleReplayBuffer
def sac_step(t: int, done: bool = False, obs_dim: int = 3) -> dict[str, Any]:
    return {"obs": np.full(obs_dim, t, np.float32), "act": ActionSample(np.array([t, -t])),
            "rew": float(t), "next_obs": np.full(obs_dim, t + 0.5, np.float32), "done": done}


def test_simple_replay_buffer_signature_and_store() -> None:
    """Sections 'class SimpleReplayBuffer(obs_dim, act_dim, size, batch_size)' and
    'store(buffer_dict)': obs, act (.action), rew, next_obs, done; tensors accepted."""
    params = inspect.signature(src.SimpleReplayBuffer).parameters
    assert list(params)[:4] == ["obs_dim", "act_dim", "size", "batch_size"]
    buf = src.SimpleReplayBuffer(3, 2, 10, 4, seed=0)
    buf.store(sac_step(1))
    buf.store({"obs": torch.ones(1, 3, requires_grad=True), "act": ActionSample(
        torch.tensor([[0.5, 0.5]])), "rew": torch.tensor(2.0), "next_obs": torch.zeros(3),
        "done": torch.tensor(True)})
    assert len(buf) == 2 and "size=10" in repr(buf)
    # the translated store (tensors, [1, dim] rows) holds the same values as plain numpy
    got = buf.sample_batch()
    row = int(torch.argmax(got["rew"]))
    np.testing.assert_allclose(got["obs"][row], [1, 1, 1])
    np.testing.assert_allclose(got["act"][row], [0.5, 0.5])
    np.testing.assert_allclose(got["obs2"][row], [0, 0, 0])
    assert got["done"][row] == 1.0 and got["done"][1 - row] == 0.0
    np.testing.assert_allclose(got["obs2"][1 - row], [1.5, 1.5, 1.5])
    with pytest.raises(ArgumentError, match=r"missing key 'next_obs'"):
        buf.store({k: v for k, v in sac_step(0).items() if k != "next_obs"})
    with pytest.raises(ArgumentError, match=r"has no \.action"):
        buf.store({**sac_step(0), "act": np.zeros(2)})
    with pytest.raises(ShapeError, match=r"buffer_dict\['next_obs'\].*expected 3 values"):
        buf.store({**sac_step(0), "next_obs": np.zeros(2)})
    with pytest.raises(ConfigError, match=r"batch_size=0: must be an int >= 1"):
        src.SimpleReplayBuffer(3, 2, 10, 0)
    assert len(buf) == 2


def test_simple_replay_buffer_sample_batch() -> None:
    """Section 'sample_batch()' (Returns: dict of batched information): obs, obs2, act,
    rew, done as float32 tensors; min(batch_size, stored) distinct transitions."""
    buf = src.SimpleReplayBuffer(3, 2, 10, 4, seed=0)
    with pytest.raises(EmptyBufferError, match="empty"):
        buf.sample_batch()
    for t in range(3):
        buf.store(sac_step(t, done=t == 2))
    small = buf.sample_batch()
    assert sorted(small["obs"][:, 0].tolist()) == [0.0, 1.0, 2.0]  # fewer than batch_size
    for t in range(3, 8):
        buf.store(sac_step(t))
    b = buf.sample_batch()
    assert {k: tuple(v.shape) for k, v in b.items()} == {
        "obs": (4, 3), "obs2": (4, 3), "act": (4, 2), "rew": (4,), "done": (4,)}
    assert all(v.dtype == torch.float32 for v in b.values())
    t = b["obs"][:, 0]
    assert len(set(t.tolist())) == 4  # distinct transitions
    np.testing.assert_allclose(b["obs2"][:, 0], t + 0.5)
    np.testing.assert_allclose(b["act"], torch.stack([t, -t], 1))
    np.testing.assert_allclose(b["rew"], t)
    np.testing.assert_allclose(b["done"], (t == 2).float())


def test_simple_replay_buffer_is_fifo() -> None:
    """Section 'class SimpleReplayBuffer' ("a simple FIFO experience replay buffer"): the
    oldest transitions are overwritten once size are stored."""
    buf = src.SimpleReplayBuffer(3, 2, 5, 5, seed=0)
    for t in range(12):
        buf.store(sac_step(t))
    assert len(buf) == 5
    assert sorted(buf.sample_batch()["obs"][:, 0].tolist()) == [7.0, 8.0, 9.0, 10.0, 11.0]


def test_simple_replay_buffer_finish_path_is_a_no_op() -> None:
    """Section 'SimpleReplayBuffer.finish_path(action_obj=None)': accepted and ignored."""
    buf = src.SimpleReplayBuffer(3, 2, 5, 2, seed=0)
    buf.store(sac_step(0))
    assert buf.finish_path() is None and buf.finish_path(ActionSample(value=1.0)) is None
    assert len(buf) == 1


# ---------------------------------------------------------------------- a PPO loop
# A CartPole PPO loop in the original project's style. The only replaybank-specific line
# is the import below ("from src.buffers.PPOBuffer import PPOBuffer" in the original).
from replaybank.compat.src import PPOBuffer  # noqa: E402


class Agent:
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        torch.manual_seed(0)
        nn = torch.nn
        self.pi = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, n_actions))
        self.v = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 1))
        self.opt = torch.optim.Adam([*self.pi.parameters(), *self.v.parameters()], lr=3e-3)

    def select_action(self, obs: Any) -> ActionSample:
        with torch.no_grad():
            o = torch.as_tensor(obs, dtype=torch.float32)
            dist = torch.distributions.Categorical(logits=self.pi(o))
            a = dist.sample()
            return ActionSample(action=a.numpy(), value=self.v(o).squeeze(-1),
                                logp=dist.log_prob(a))

    def update(self, data: dict[str, Any]) -> tuple[float, float]:
        dist = torch.distributions.Categorical(logits=self.pi(data["obs"]))
        logp = dist.log_prob(data["act"][:, 0].long())
        ratio = torch.exp(logp - data["logp"])
        clip = torch.clamp(ratio, 0.8, 1.2) * data["adv"]
        loss_pi = -torch.min(ratio * data["adv"], clip).mean()
        loss_v = ((self.v(data["obs"]).squeeze(-1) - data["ret"]) ** 2).mean()
        self.opt.zero_grad()
        (loss_pi + 0.5 * loss_v).backward()
        self.opt.step()
        return float(loss_pi.detach()), float(loss_v.detach())


def test_cartpole_ppo_loop_learns() -> None:
    """Sections 'PPOBuffer' end to end: a CartPole PPO loop (store every step,
    finish_path at episode ends and the epoch cut, sample_batch at the end of the epoch,
    minibatches of batch_size drawn from it) learns, and each epoch's advantages are
    normalised."""
    gym = pytest.importorskip("gymnasium")
    torch.set_num_threads(1)
    env = gym.make("CartPole-v1")
    steps_per_epoch, epochs = 1000, 8
    agent = Agent(4, 2)
    replay_buffer = PPOBuffer(obs_dim=4, act_dim=1, size=steps_per_epoch, batch_size=250,
                              gamma=0.99, lam=0.95)
    obs, _ = env.reset(seed=0)
    lengths: list[list[int]] = []
    ep_len = 0
    for _epoch in range(epochs):
        lengths.append([])
        for t in range(steps_per_epoch):
            action_obj = agent.select_action(obs)
            next_obs, reward, terminated, truncated, _ = env.step(int(action_obj.action))
            replay_buffer.store({"obs": obs, "act": action_obj, "rew": reward,
                                 "next_obs": next_obs, "done": terminated})
            obs, ep_len = next_obs, ep_len + 1
            if terminated:
                replay_buffer.finish_path(None)
            elif truncated or t == steps_per_epoch - 1:
                replay_buffer.finish_path(agent.select_action(obs))  # bootstrap V(s_T)
            if terminated or truncated:
                lengths[-1].append(ep_len)
                obs, _ = env.reset()
                ep_len = 0
        data = replay_buffer.sample_batch()  # all of the epoch, advantages normalised
        adv = data["adv"]
        assert len(adv) == steps_per_epoch
        assert abs(float(adv.mean())) < 1e-4 and abs(float(adv.std(False)) - 1) < 1e-2
        for _ in range(4):  # 4 passes of 4 minibatches of batch_size
            for idx in torch.randperm(steps_per_epoch).split(replay_buffer.batch_size):
                loss_pi, loss_v = agent.update({k: v[idx] for k, v in data.items()})
                assert math.isfinite(loss_pi) and math.isfinite(loss_v)
    first, last = np.mean(lengths[0]), np.mean(lengths[-1])
    print(f"mean episode length: epoch 1 {first:.1f}, epoch {epochs} {last:.1f}")
    assert last > 2 * first and last > 60, (first, last)


# ---------------------------------------------------------------------- hardening (issue
# items 9, 16, 17): the reference's sample_batch and schema; hostile arguments raise
# library errors and leave the buffers unchanged
import subprocess  # noqa: E402
import sys  # noqa: E402

import replaybank as rb  # noqa: E402


def test_sample_batch_returns_all_of_the_epoch() -> None:
    """Issue item 16, section 'sample_batch()': "get all of the data from the buffer, with
    advantages appropriately normalized (shifted to have mean zero and std one). Also,
    resets some pointers": every stored step, in order, not batch_size of them."""
    rng = np.random.default_rng(2)
    buf = src.PPOBuffer(2, 1, 40, 8, gamma=0.9, lam=0.8)
    advs, rets = fill(buf, rng, [12, 9, 6], [True, False, True])
    data = buf.sample_batch()
    assert {k: tuple(v.shape) for k, v in data.items()} == {
        "obs": (27, 2), "act": (27, 1), "ret": (27,), "adv": (27,), "logp": (27,)}
    np.testing.assert_array_equal(data["obs"][:, 0].numpy(), np.arange(27))  # in order
    np.testing.assert_allclose(data["ret"], rets, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(data["adv"], normalise(advs, 1e-3), rtol=1e-4, atol=1e-5)
    assert len(buf) == 0  # pointers reset: the next store starts a new epoch
    again = buf.sample_batch()  # no new steps: the same epoch again
    assert all(torch.equal(again[k], data[k]) for k in data)
    fill(buf, rng, [5], [True])
    assert len(buf.sample_batch()["obs"]) == 5


def test_schema_is_the_documented_strictyaml_map() -> None:
    """Issue item 17, sections 'schema': PPOBuffer.schema and SimpleReplayBuffer.schema are
    the strictyaml Maps the reference shows, so strictyaml.load(text, PPOBuffer.schema)
    reads a config; the pydantic models stay beside them (config_model)."""
    strictyaml = pytest.importorskip("strictyaml")
    assert repr(src.PPOBuffer.schema) == (
        "Map({'obs_dim': Int(), 'act_dim': Int(), 'size': Int(), 'batch_size': Int(), "
        "Optional(\"gamma\"): Float(), Optional(\"lam\"): Float(), Optional(\"eps\"): Float()})")
    assert repr(src.SimpleReplayBuffer.schema) == (
        "Map({'obs_dim': Int(), 'act_dim': Int(), 'size': Int(), 'batch_size': Int()})")
    assert src.PPOBuffer.schema is src.PPOBuffer.schema  # built once
    text = "obs_dim: 4\nact_dim: 1\nsize: 64\nbatch_size: 8\neps: 1e-3\n"
    data = strictyaml.load(text, src.PPOBuffer.schema).data
    assert data == {"obs_dim": 4, "act_dim": 1, "size": 64, "batch_size": 8, "eps": 0.001}
    assert src.PPOBuffer.instantiate_from_config_dict(data).eps == 0.001
    with pytest.raises(strictyaml.YAMLValidationError):
        strictyaml.load(text + "lamda: 0.9\n", src.PPOBuffer.schema)
    sac = strictyaml.load("obs_dim: 3\nact_dim: 2\nsize: 10\nbatch_size: 4\n",
                          src.SimpleReplayBuffer.schema).data
    assert src.SimpleReplayBuffer(**sac).size == 10
    assert src.PPOBuffer.config_model is src.PPOBufferConfig
    assert src.SimpleReplayBuffer.config_model is src.SimpleReplayBufferConfig
    assert src.PPOBuffer(4, 1, 8, 2).schema is src.PPOBuffer.schema


def test_strictyaml_stays_an_optional_import() -> None:
    """Issue item 17: importing the front end (and building, filling and sampling its
    buffers) imports no strictyaml; it is imported where the schema is asked for."""
    pytest.importorskip("strictyaml")
    code = ("import sys, numpy as np\n"
            "import replaybank.compat.src as src\n"
            "b = src.SimpleReplayBuffer(2, 1, 4, 2, device='cpu')\n"
            "src.PPOBuffer.instantiate_from_config_dict({'obs_dim': 2, 'act_dim': 1, "
            "'size': 4, 'batch_size': 2})\n"
            "assert 'strictyaml' not in sys.modules\n"
            "src.PPOBuffer.schema\n"
            "assert 'strictyaml' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def ppo_snapshot(buf: src.PPOBuffer) -> dict[str, Any]:
    data = buf.path.rollout.data
    return {"len": len(buf), "start": buf.path.path_start,
            "adv": buf.path.advantages.copy(), "ret": buf.path.returns_to_go.copy(),
            "data": {k: np.array(v, copy=True) for k, v in data.items()}}


def sac_snapshot(buf: src.SimpleReplayBuffer) -> dict[str, Any]:
    core = buf.buffer
    arrays = core.table.arrays if core.allocated else {}
    return {"len": len(buf), "rng": json.dumps(core.rng.bit_generator.state, default=str),
            "data": {k: np.array(v, copy=True) for k, v in arrays.items()}}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def eq(x: Any, y: Any) -> bool:
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, np.ndarray):
            return np.array_equal(x, y, equal_nan=True)
        return bool(x == y)
    return eq(a, b)


def ppo_step(**changes: Any) -> dict[str, Any]:
    act = ActionSample(np.zeros(1), 0.5, -0.1)
    for name in ("action", "value", "logp"):
        if name in changes:
            setattr(act, name, changes.pop(name))
    return {"obs": np.zeros(2, np.float32), "act": act, "rew": 1.0, **changes}


def sac_bad(**changes: Any) -> dict[str, Any]:
    step = sac_step(1, obs_dim=2)
    step["act"] = ActionSample(np.array([0.5]))
    if "action" in changes:
        step["act"].action = changes.pop("action")
    return {**step, **changes}


#: (label, buffer kind, call, error type, text the message names)
SRC_BAD_CALLS: list[tuple[str, str, Any, type[Exception], str]] = [
    ("PPOBuffer(obs_dim=None)", "ppo", lambda b: src.PPOBuffer(None, 1, 8, 4),
     ConfigError, "obs_dim"),
    ("PPOBuffer(size=0)", "ppo", lambda b: src.PPOBuffer(2, 1, 0, 4), ConfigError, "size"),
    ("PPOBuffer(gamma='x')", "ppo", lambda b: src.PPOBuffer(2, 1, 8, 4, gamma="x"),
     ConfigError, "gamma"),
    ("PPOBuffer(lam=nan)", "ppo", lambda b: src.PPOBuffer(2, 1, 8, 4, lam=float("nan")),
     ConfigError, "lam"),
    ("PPOBuffer(device='nope')", "ppo", lambda b: src.PPOBuffer(2, 1, 8, 4, device="nope"),
     ConfigError, "device"),
    ("PPOBuffer(device=3.5)", "ppo", lambda b: src.PPOBuffer(2, 1, 8, 4, device=3.5),
     ConfigError, "device"),
    ("PPOBuffer(seed='x')", "ppo", lambda b: src.PPOBuffer(2, 1, 8, 4, seed="x"),
     ConfigError, "seed"),
    ("store(None)", "ppo", lambda b: b.store(None), ArgumentError, "buffer_dict"),
    ("store('x')", "ppo", lambda b: b.store("obs"), ArgumentError, "buffer_dict"),
    ("store([])", "ppo", lambda b: b.store([]), ArgumentError, "buffer_dict"),
    ("store(obs=None)", "ppo", lambda b: b.store(ppo_step(obs=None)), rb.DtypeError, "obs"),
    ("store(obs='ab')", "ppo", lambda b: b.store(ppo_step(obs="ab")), rb.DtypeError, "obs"),
    ("store(obs=[3])", "ppo", lambda b: b.store(ppo_step(obs=np.zeros(3))), ShapeError,
     "obs"),
    ("store(action=None)", "ppo", lambda b: b.store(ppo_step(action=None)), rb.DtypeError,
     "action"),
    ("store(action=[None])", "ppo", lambda b: b.store(ppo_step(action=[None])),
     rb.DtypeError, "action"),
    ("store(rew=None)", "ppo", lambda b: b.store(ppo_step(rew=None)), rb.DtypeError, "rew"),
    ("store(rew='x')", "ppo", lambda b: b.store(ppo_step(rew="x")), rb.DtypeError, "rew"),
    ("store(rew=nan)", "ppo", lambda b: b.store(ppo_step(rew=float("nan"))), ConfigError,
     "rew"),
    ("store(rew=tensor[3])", "ppo", lambda b: b.store(ppo_step(rew=torch.zeros(3))),
     ShapeError, "rew"),
    ("store(value=None)", "ppo", lambda b: b.store(ppo_step(value=None)), rb.DtypeError,
     "value"),
    ("store(value=inf)", "ppo", lambda b: b.store(ppo_step(value=float("inf"))),
     ConfigError, "value"),
    ("store(logp='x')", "ppo", lambda b: b.store(ppo_step(logp="x")), rb.DtypeError, "logp"),
    ("finish_path('x')", "ppo", lambda b: b.finish_path("x"), ArgumentError, "action_obj"),
    ("finish_path(True)", "ppo", lambda b: b.finish_path(True), ArgumentError, "action_obj"),
    ("finish_path(nan)", "ppo", lambda b: b.finish_path(float("nan")), ConfigError,
     r"finish_path: action_obj=nan: must be a finite number"),
    ("finish_path(inf)", "ppo", lambda b: b.finish_path(float("inf")), ConfigError,
     r"finish_path: action_obj=inf"),
    ("finish_path(value=nan)", "ppo",
     lambda b: b.finish_path(ActionSample(value=torch.tensor([float("nan")]))), ConfigError,
     r"finish_path: action_obj\.value=nan"),
    ("finish_path(value='x')", "ppo", lambda b: b.finish_path(ActionSample(value="x")),
     rb.DtypeError, "value"),
    ("finish_path(value=None)", "ppo", lambda b: b.finish_path(ActionSample(value=None)),
     rb.DtypeError, "value"),
    ("finish_path(value=[1, 2])", "ppo", lambda b: b.finish_path(ActionSample(value=[1, 2])),
     ShapeError, "value"),
    ("sample_batch() unfinished", "ppo", lambda b: b.sample_batch(), EmptyBufferError,
     "finish_path"),
    ("discount_cumsum('abc')", "ppo", lambda b: src.discount_cumsum("abc", 0.9),
     rb.DtypeError, "x="),
    ("discount_cumsum([None, 1])", "ppo", lambda b: src.discount_cumsum([None, 1.0], 0.9),
     rb.DtypeError, "x="),
    ("discount_cumsum(discount='x')", "ppo", lambda b: src.discount_cumsum([1.0], "x"),
     ConfigError, "discount"),
    ("discount_cumsum(discount=None)", "ppo", lambda b: src.discount_cumsum([1.0], None),
     ConfigError, "discount"),
    ("SimpleReplayBuffer(act_dim=-1)", "sac", lambda b: src.SimpleReplayBuffer(2, -1, 8, 4),
     ConfigError, "act_dim"),
    ("SimpleReplayBuffer(device='nope')", "sac",
     lambda b: src.SimpleReplayBuffer(2, 1, 8, 4, device="nope"), ConfigError, "device"),
    ("S.store(None)", "sac", lambda b: b.store(None), ArgumentError, "buffer_dict"),
    ("S.store(obs=None)", "sac", lambda b: b.store(sac_bad(obs=None)), rb.DtypeError, "obs"),
    ("S.store(next_obs='ab')", "sac", lambda b: b.store(sac_bad(next_obs="ab")),
     rb.DtypeError, "next_obs"),
    ("S.store(action=None)", "sac", lambda b: b.store(sac_bad(action=None)), rb.DtypeError,
     "action"),
    ("S.store(rew=None)", "sac", lambda b: b.store(sac_bad(rew=None)), rb.DtypeError, "rew"),
    ("S.store(rew=[1, 2])", "sac", lambda b: b.store(sac_bad(rew=[1, 2])), ShapeError,
     "rew"),
    ("S.store(done=None)", "sac", lambda b: b.store(sac_bad(done=None)), rb.DtypeError,
     "done"),
    ("S.store(done='False')", "sac", lambda b: b.store(sac_bad(done="False")), rb.DtypeError,
     "done"),
    ("S.store(done=nan)", "sac", lambda b: b.store(sac_bad(done=float("nan"))),
     rb.DtypeError, "done"),
    ("S.store(done=2)", "sac", lambda b: b.store(sac_bad(done=2)), rb.DtypeError, "done"),
    ("S.store(done=0.5)", "sac", lambda b: b.store(sac_bad(done=0.5)), rb.DtypeError, "done"),
    ("S.store(done=tensor[3])", "sac", lambda b: b.store(sac_bad(done=torch.zeros(3))),
     ShapeError, "done"),
    ("S.finish_path('x')", "sac", lambda b: b.finish_path("x"), ArgumentError, "action_obj"),
    ("S.finish_path(True)", "sac", lambda b: b.finish_path(True), ArgumentError,
     "action_obj"),
]


def _src_buffers() -> tuple[src.PPOBuffer, src.SimpleReplayBuffer]:
    ppo = src.PPOBuffer(2, 1, 8, 4)
    for _ in range(3):
        ppo.store(ppo_step())
    ppo.finish_path(None)
    ppo.store(ppo_step())  # an unfinished path
    sac = src.SimpleReplayBuffer(2, 1, 8, 4, seed=0, device="cpu")
    for t in range(3):
        sac.store(sac_bad(obs=np.full(2, t, np.float32)))
    return ppo, sac


@pytest.mark.parametrize("label,kind,call,error,name", SRC_BAD_CALLS,
                         ids=[c[0] for c in SRC_BAD_CALLS])
def test_hostile_arguments_raise_library_errors(label: str, kind: str, call: Any,
                                                error: type[Exception], name: str) -> None:
    """Issue item 9 (src): every public entry point (constructors, store, finish_path,
    sample_batch, discount_cumsum) refuses hostile arguments with a replaybank error of
    the documented kind whose message names the argument; the buffer is unchanged."""
    ppo, sac = _src_buffers()
    buf: Any = ppo if kind == "ppo" else sac
    before = ppo_snapshot(ppo) if kind == "ppo" else sac_snapshot(sac)
    with pytest.raises(error, match=name) as info:
        call(buf)
    assert isinstance(info.value, rb.ReplayBankError), type(info.value)
    after = ppo_snapshot(ppo) if kind == "ppo" else sac_snapshot(sac)
    assert same(before, after)


@settings(max_examples=30, deadline=None)
@given(picks=st.lists(st.sampled_from(SRC_BAD_CALLS), min_size=1, max_size=6))
def test_any_sequence_of_hostile_calls_leaves_the_buffers_working(
        picks: list[tuple[str, str, Any, type[Exception], str]]) -> None:
    """Issue item 9 (src, property): any sequence of hostile calls raises replaybank
    errors, changes nothing, and the buffers then work as before (the PPO epoch equals the
    plain-loop oracle)."""
    ppo, sac = _src_buffers()
    before = (ppo_snapshot(ppo), sac_snapshot(sac))
    for _label, kind, call, _error, _name in picks:
        with pytest.raises(rb.ReplayBankError):
            call(ppo if kind == "ppo" else sac)
    assert same(before[0], ppo_snapshot(ppo)) and same(before[1], sac_snapshot(sac))
    ppo.finish_path(None)
    adv, _ = oracle_path([1.0] * 3, [0.5] * 3, 0.0, ppo.gamma, ppo.lam)
    adv1, _ = oracle_path([1.0], [0.5], 0.0, ppo.gamma, ppo.lam)
    np.testing.assert_allclose(ppo.sample_batch()["adv"], normalise(adv + adv1, 1e-3),
                               rtol=1e-4, atol=1e-5)
    assert len(sac.sample_batch()["obs"]) == 3


def test_config_file_that_is_not_text_raises_config_error(tmp_path: Path) -> None:
    """Issue item 9 (src): a config file that is not UTF-8 text raises ConfigError (it
    raised UnicodeDecodeError)."""
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00obs_dim")
    with pytest.raises(ConfigError, match=r"binary\.yaml"):
        src.PPOBuffer.instantiate_from_config(path)
