"""Configs: parity with every constructor, files, registries and error messages."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank import config as cfgmod
from replaybank.errors import ConfigError
from tests.roundtrip import add_random, assert_same


def _own_params(cls: type) -> tuple[set[str], bool]:
    sig = inspect.signature(cls.__init__)
    names = {n for n, p in sig.parameters.items()
             if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return names, any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def test_every_constructor_argument_has_a_config_field() -> None:
    assert {"ReplayBuffer", "PrioritizedReplayBuffer", "SequenceReplayBuffer",
            "RolloutBuffer", "PathBuffer"} <= set(cfgmod.buffer_types())
    for name in cfgmod.buffer_types():
        entry = cfgmod._BUFFERS[name]
        cls = entry.resolve()
        want, more = _own_params(cls)
        if more:  # **kwargs reach the wrapped/base ReplayBuffer: those are reachable too
            target = cfgmod._Entry(entry.kwargs_to).resolve() if entry.kwargs_to else \
                cls.__mro__[1]
            base, _ = _own_params(target)
            want |= base - set(entry.exclude)
        fields = set(cfgmod.config_model(name).model_fields)
        assert want <= fields, f"{name}: no config field for {sorted(want - fields)}"
        assert fields - want == {"type"}, f"{name}: config fields {fields - want} unused"


def _subset(want: Any, got: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and _subset(v, got[k])
                                             for k, v in want.items())
    return bool(want == got)


def test_every_public_buffer_type_is_registered() -> None:
    public = {n for n in rb.__all__ if n.endswith("Buffer") and isinstance(getattr(rb, n), type)}
    assert public and public <= set(cfgmod.buffer_types()), public - set(cfgmod.buffer_types())


# non-default values of every argument (per type) -> config -> rebuild -> same config
NON_DEFAULT: dict[str, dict[str, Any]] = {
    "ReplayBuffer": dict(capacity=12, num_envs=3, spec={"obs": ((2,), "float16"),
                                                        "action": ((), "int32")},
                         n_step=3, gamma=0.5, frame_stack=2,
                         sampler={"type": "recent", "eta": 0.9, "c_min": 3,
                                  "prioritized": {"type": "prioritized", "alpha": 0.3}}),
    "PrioritizedReplayBuffer": dict(capacity=8, alpha=0.3, beta=0.2, eps=0.01,
                                    weight_norm="batch", num_envs=2, beta_schedule="linear",
                                    beta_steps=50, n_step=2, gamma=0.8),
    "SequenceReplayBuffer": dict(capacity=20, num_envs=2, sequence_length=5,
                                 episode_boundary="cross", strict=False, burn_in=2,
                                 state_fields=["h"], lane_split="random"),
    "RolloutBuffer": dict(num_steps=6, num_envs=3, gamma=0.9, gae_lambda=0.7,
                          normalize_advantage="minibatch", advantage_eps=0.5, seed=4,
                          backend="numpy"),
    "PathBuffer": dict(size=9, gamma=0.5, lam=0.4, eps=0.1, backend="numpy"),
}


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_config_round_trip_keeps_every_argument(name: str) -> None:
    cfg = cfgmod.validate_config({"type": name, **NON_DEFAULT[name]})
    buf = rb.from_config(cfg)
    assert type(buf).__name__ == name
    got = cfgmod.buffer_config(buf)
    expected = cfg.model_dump()
    if name in ("ReplayBuffer", "SequenceReplayBuffer"):
        # a lane_split/sampler given by name is reported as the sampler it built
        expected["lane_split"], got_dump = None, got.model_dump()
        if name == "SequenceReplayBuffer":
            expected["sampler"] = {"type": "lane_split"}
    else:
        got_dump = got.model_dump()
    for key, value in NON_DEFAULT[name].items():
        if key in ("spec", "lane_split", "sampler"):
            continue
        assert got_dump[key] == (list(value) if isinstance(value, tuple) else value), key
    for key in expected:
        if key == "sampler" and expected[key] is not None:
            assert _subset(expected[key], got_dump[key]), (expected[key], got_dump[key])
        elif key != "spec":
            assert got_dump[key] == expected[key], key
    again = rb.from_config(got)
    assert cfgmod.buffer_config(again).model_dump() == got_dump


def test_from_config_of_config_is_equivalent_empty_buffer() -> None:
    buf = rb.ReplayBuffer(20, num_envs=2, n_step=2, gamma=0.9, seed=3)
    add_random(buf, np.random.default_rng(0), 15)
    twin = rb.from_config(buf.config())
    assert len(twin) == 0 and twin.spec == buf.spec and twin.capacity == 20
    assert twin.view.config() == buf.view.config()
    ref = rb.ReplayBuffer(20, num_envs=2, n_step=2, gamma=0.9, spec=buf.spec)  # by hand
    for b in (ref, twin):
        b.rng.bit_generator.state = np.random.default_rng(9).bit_generator.state
        add_random(b, np.random.default_rng(1), 12)
    assert_same(ref.sample(8), twin.sample(8))


def test_buffer_config_is_a_validated_model() -> None:
    cfg = rb.ReplayBuffer(8).config()
    assert isinstance(cfg, rb.BufferConfig) and isinstance(cfg, rb.ReplayBufferConfig)
    assert cfg.type == "ReplayBuffer" and cfg.spec is None and cfg.view is None
    json.dumps(cfg.model_dump(mode="json"))
    with pytest.raises(ConfigError, match="Wrong"):
        rb.from_config(cfg.model_copy(update={"type": "Wrong"}))


def test_files_yaml_and_json(tmp_path: Path) -> None:
    yml = tmp_path / "buf.yaml"
    yml.write_text("buffer:\n  type: PrioritizedReplayBuffer\n  capacity: 64\n  alpha: 0.5\n"
                   "  num_envs: 2\n  spec:\n    obs: {shape: [4], dtype: uint8}\n"
                   "    action: {shape: [], dtype: int64}\n")
    buf = rb.from_config(yml)
    assert isinstance(buf, rb.PrioritizedReplayBuffer) and buf.sampler.alpha == 0.5
    assert buf.spec["obs"].dtype == np.uint8
    js = tmp_path / "buf.json"
    js.write_text(json.dumps(buf.config().model_dump(mode="json")))
    again = rb.from_config(str(js), capacity=32)
    assert again.capacity == 32 and again.config().alpha == 0.5
    assert rb.from_config(js).config() == buf.config()


@pytest.mark.parametrize("bad,match", [
    ({"capacity": 0}, "capacity=0: must be a positive int"),
    ({"capacity": -5}, "capacity=-5: must be a positive int"),
    ({"capacity": 2.5}, "capacity=2.5: must be a positive int"),
    ({"capacity": True}, "capacity=True: must be a positive int"),
    ({"capacity": "100"}, "capacity='100': must be a positive int"),
    ({}, "missing required key 'capacity'"),
    ({"capacity": 8, "num_envs": 0}, "num_envs=0: must be a positive int"),
    ({"capacity": 8, "gamma": 1.5}, r"gamma=1.5: must be a float in \[0, 1\]"),
    ({"capacity": 8, "capcity": 3},
     r"unknown key 'capcity' \(value 3\) \(did you mean 'capacity'\?\); allowed keys: \["),
    ({"type": "Replay", "capacity": 8}, r"type='Replay': unknown buffer type \(did you mean "
                                        r"'ReplayBuffer'\?\); known types: \[.*'ReplayBuffer'"),
    ({"type": "Sampler", "capacity": 8}, r"type='Sampler': unknown buffer type; known types"),
    # YAML 1.1 reads 1e6 as text; a whole float is not an int either
    ({"capacity": "1e6"}, r"capacity='1e6': must be a positive int; write 1000000 or "
                          r"1_000_000 \(YAML reads 1e6 as text\)"),
    ({"capacity": 1e3}, r"capacity=1000.0: must be a positive int; write 1000 or 1_000$"),
    ({"capacity": 8, "sampler": {"type": "prioritised"}},
     r"sampler.type='prioritised': unknown sampler type \(did you mean 'prioritized'\?\)"),
    ({"capacity": 8, "sampler": {"type": "fifo"}},
     r"sampler.type='fifo': unknown sampler type; known types: \[.*'uniform'"),
    ({"capacity": 8, "sampler": {"type": "prioritized", "alfa": 1}},
     r"unknown sampler argument\(s\) \['alfa'\] for 'prioritized'; allowed: \['alpha'"),
    ({"capacity": 8, "sampler": {"type": "recent", "prioritized": {"type": "nope"}}},
     "sampler.prioritized.type='nope': unknown sampler type"),
    ({"capacity": 8, "view": {"type": "hindsight"}}, "view.type='hindsight': unknown view"),
    ({"capacity": 8, "storage": "disk"}, r"storage='disk': unknown storage; choose one of"),
    ({"capacity": 8, "storage": "memmap"}, 'storage="memmap" needs path'),
    ({"capacity": 8, "spec": {"obs": [[3], "flot32"]}}, "spec=.*not a valid spec"),
    ({"capacity": 8, "seed": -1}, "seed=-1: must be a non-negative int"),
    ({"type": "PrioritizedReplayBuffer", "capacity": 8, "sampler": {"type": "uniform"}},
     "unknown key 'sampler'"),
    (["capacity", 8], "expected a mapping"),
    ("no_such_file.yaml", "config file no_such_file.yaml does not exist"),
])
def test_error_messages(bad: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        rb.from_config(bad)


def test_constructor_errors_pass_through() -> None:
    with pytest.raises(rb.CapacityError, match="does not divide by num_envs=4"):
        rb.from_config({"capacity": 10, "num_envs": 4})


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        rb.from_config(tmp_path / "missing.yaml")
    (tmp_path / "c.toml").write_text("x")
    with pytest.raises(ConfigError, match=r"unknown suffix '\.toml'"):
        rb.from_config(tmp_path / "c.toml")
    (tmp_path / "c.yaml").write_text("capacity: [unclosed")
    with pytest.raises(ConfigError, match="cannot parse"):
        rb.from_config(tmp_path / "c.yaml")
    (tmp_path / "l.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a mapping"):
        rb.from_config(tmp_path / "l.json")


class TaggedBuffer(rb.ReplayBuffer):
    """A user's buffer type with one extra argument."""

    def __init__(self, capacity: int, tag: str = "x", **kwargs: Any) -> None:
        self.tag = tag
        super().__init__(capacity, **kwargs)


class EveryOther:
    """A user's sampler: the newest steps of lane 0 only (for the registry test)."""

    def __init__(self, stride: int = 2) -> None:
        self.stride = stride

    def bind(self, T: int, lanes: int) -> None:  # noqa: N803
        return None

    def on_write(self, slots: Any, priorities: Any = None) -> None:
        return None

    def on_clear(self) -> None:
        return None

    def sample(self, batch_size: int, lanes: Any, rng: Any, **kw: Any) -> Any:
        return rb.UniformSampler().sample(batch_size, lanes, rng, **kw)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def config(self) -> dict[str, Any]:
        return {"type": "every_other", "stride": self.stride}


def test_registering_new_types(tmp_path: Path) -> None:
    buf = TaggedBuffer(8, tag="hello", sampler=EveryOther(3))
    with pytest.raises(ConfigError, match="not a registered buffer type"):
        buf.config()
    rb.register_buffer("TaggedBuffer", TaggedBuffer)
    with pytest.raises(ConfigError, match="unknown sampler type"):
        buf.config()
    rb.register_sampler("every_other", EveryOther)
    try:
        cfg = buf.config()
        assert cfg.tag == "hello" and cfg.sampler.model_dump() == {"type": "every_other",
                                                                   "stride": 3}
        again = rb.from_config(cfg.model_dump())
        assert isinstance(again, TaggedBuffer) and again.sampler.stride == 3
        add_random(buf, np.random.default_rng(0), 5)
        buf.save(tmp_path)
        assert rb.load(tmp_path).tag == "hello"
    finally:
        cfgmod._BUFFERS.pop("TaggedBuffer")
        cfgmod._SAMPLERS.pop("every_other")
        cfgmod.config_model.cache_clear()


def test_view_configs_rebuild() -> None:
    view = rb.FrameStackView(3, inner=rb.NStepView(2, 0.5))
    buf = rb.ReplayBuffer(16, view=view)
    cfg = buf.config()
    assert cfg.view is not None and cfg.view.type == "framestack"
    again = rb.from_config(cfg)
    assert again.view.config() == view.config()


def test_numpy_scalar_hyperparameters_are_plain_numbers_everywhere(tmp_path: Path) -> None:
    """``n_step``, ``gamma`` and ``frame_stack`` as numpy scalars (a sweep's
    ``np.arange``, values read back from numpy files): the buffer is built as with Python
    numbers, its config and checkpoint round-trip, and the rows-per-lane check still holds;
    numpy bools are refused like bools."""
    buf = rb.ReplayBuffer(64, seed=0, n_step=np.int64(3), gamma=np.float32(0.5),
                          frame_stack=np.int64(2))
    plain = rb.ReplayBuffer(64, seed=0, n_step=3, gamma=0.5, frame_stack=2)
    for b in (buf, plain):
        for i in range(10):
            b.add(obs=np.full(3, i, np.float32), action=0, reward=1.0,
                  next_obs=np.full(3, i + 1, np.float32), terminated=False, truncated=False)
    assert buf.config() == plain.config()
    assert json.loads(json.dumps(buf.init_config())) == plain.init_config()
    a, b = buf.sample(4), plain.sample(4)
    for k in b:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    rb.save(buf, tmp_path / "b")
    assert rb.load(tmp_path / "b").config() == plain.config()
    with pytest.raises(rb.CapacityError, match="n_step=100: exceeds the 64 rows per lane"):
        rb.ReplayBuffer(64, n_step=np.int64(100))
    with pytest.raises(ConfigError, match=r"n_step=np.True_: must be an int >= 1; pass e.g."):
        rb.ReplayBuffer(64, n_step=np.bool_(True))
    with pytest.raises(ConfigError, match=r"gamma=.*: must be a float in \[0, 1\]"):
        rb.ReplayBuffer(64, n_step=3, gamma=np.float64(np.nan))


# ---------------------------------------------------------------------- values as written
#: A valid value of each required constructor argument, to build a config around one field.
_REQUIRED = {"capacity": 8, "num_steps": 4, "n_steps": 4, "size": 8, "agents": ["a", "b"]}


def _kinds(annotation: Any) -> set[type]:
    """The simple kinds (int, float, bool, str, None) of a config field's annotation."""
    import types
    import typing

    args = typing.get_args(annotation) if typing.get_origin(annotation) in (
        typing.Union, types.UnionType) else (annotation,)
    return {a for a in args if a in (int, float, bool, str, type(None))}


def _typed_fields() -> list[tuple[str, str, type]]:
    """(buffer type, field, kind) of every int, float and bool field of every config model."""
    out = []
    for name in cfgmod.buffer_types():
        for field, info in cfgmod.config_model(name).model_fields.items():
            kinds = _kinds(info.annotation)
            for kind in (bool, int, float):
                if kind in kinds:
                    out.append((name, field, kind))
                    break
    return out


#: A value written the wrong way for each kind, and the fix the message must give.
_WRONG: dict[type, list[tuple[Any, str]]] = {
    int: [("4", r"write 4 \(a number, not text\)"), (4.0, "write 4$"),
          ("2e3", r"write 2000 or 2_000 \(YAML reads 2e3 as text\)"),
          (4.5, "write a whole number, e.g. 4")],
    float: [("0.5", r"write 0\.5 \(a number, not text\)"),
            ("1e-3", r"write 0\.001 \(YAML reads 1e-3 as text\)")],
    bool: [("no", r"write false \(a bool, not text\)"), ("true", r"write true \(a bool"),
           (1, "write true")],
}


def test_every_numeric_and_bool_field_is_typed() -> None:
    fields = {(t, f) for t, f, _ in _typed_fields()}
    assert {("PrioritizedReplayBuffer", "alpha"), ("PrioritizedReplayBuffer", "beta"),
            ("RolloutBuffer", "gae_lambda"), ("HerReplayBuffer", "k"),
            ("HerReplayBuffer", "relabel_unfinished"), ("ReplayBuffer", "gamma"),
            ("ReplayBuffer", "capacity"), ("SequenceReplayBuffer", "sequence_length"),
            ("PathBuffer", "lam")} <= fields


@pytest.mark.parametrize(("type_name", "field", "kind"), _typed_fields())
def test_a_value_written_as_text_or_the_wrong_kind_is_refused(type_name: str, field: str,
                                                              kind: type) -> None:
    """docs/guarantees.md: a number given as text is not parsed, for every int, float and
    bool field of every buffer type alike, and the message says what to write."""
    base = {k: v for k, v in _REQUIRED.items()
            if k in cfgmod.config_model(type_name).model_fields}
    for value, fix in _WRONG[kind]:
        with pytest.raises(ConfigError, match=rf"^{type_name} config: {field}="
                                              rf"{re.escape(repr(value))}: must be .*; {fix}"):
            rb.from_config({"type": type_name, **base, field: value})


@pytest.mark.parametrize(("component", "match"), [
    ({"sampler": {"type": "prioritized", "alpha": "0.5"}},
     r"sampler\.alpha='0\.5': must be a float; write 0\.5 \(a number, not text\)$"),
    ({"sampler": {"type": "recent", "c_min": 10.0}}, r"sampler\.c_min=10\.0: must be an int; "
                                                      "write 10$"),
    ({"sampler": {"type": "recent", "adaptive": "yes"}},
     r"sampler\.adaptive='yes': must be true or false; write true \(a bool, not text\)$"),
    ({"view": {"type": "nstep", "n": "3"}},
     r"view\.n='3': must be an int; write 3 \(a number, not text\)$"),
])
def test_sampler_and_view_arguments_are_taken_as_written(component: dict[str, Any],
                                                         match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        rb.from_config({"capacity": 8, **component})


def test_numbers_of_the_right_kind_still_build() -> None:
    """An int for a float (1 for alpha) and numpy scalars (a sweep's values) are numbers
    written as numbers: taken, and recorded as plain Python values."""
    buf = rb.from_config({"type": "PrioritizedReplayBuffer", "capacity": np.int64(8),
                          "alpha": 1, "beta": np.float32(0.5), "n_step": np.int32(2)})
    cfg = buf.config()
    assert (cfg.capacity, cfg.alpha, cfg.beta, cfg.n_step) == (8, 1.0, 0.5, 2)
    assert type(cfg.capacity) is int and type(cfg.alpha) is float
    her = rb.from_config({"type": "HerReplayBuffer", "capacity": 8, "reward_fn": "builtins:len",
                          "k": 2, "relabel_unfinished": np.bool_(True)})
    assert her.config().relabel_unfinished is True


@pytest.mark.parametrize(("bad", "match"), [
    # the fix once, and the YAML remark only for YAML's exponent text
    ({"capacity": "64"}, r"^ReplayBuffer config: capacity='64': must be a positive int; "
                         r"write 64 \(a number, not text\)$"),
    ({"capacity": 8, "gamma": "0.9"}, r"gamma='0\.9': must be a float in \[0, 1\]; write 0\.9 "
                                      r"\(a number, not text\)$"),
    ({"capacity": 8, "gamma": 1.5}, r"gamma=1\.5: must be a float in \[0, 1\]$"),
    ({"capacity": 8, "seed": "3"}, r"seed='3': must be a non-negative int or null; write 3 "),
    # the spec's shape, braces balanced
    ({"capacity": 8, "spec": {"obs": {"shape": [3], "dtype": "float33"}}},
     r"not a valid spec \(.*float33.*\); use \{name: \{shape: \[\.\.\.\], dtype: \.\.\.\}\}$"),
    # no "did you mean 'device'" for a key of another buffer type
    ({"type": "HerReplayBuffer", "capacity": 8, "view": {"type": "nstep"}},
     r"unknown key 'view' \(value \{'type': 'nstep'\}\); allowed keys: \["),
    ({"type": "HerReplayBuffer", "capacity": 8, "reward_fn": "len", "k": 4.5},
     r"k=4\.5: must be an int; write a whole number, e\.g\. 4$"),
    ({"type": "RolloutBuffer", "num_steps": 4, "normalize_advantage": 1},
     r"normalize_advantage=1: must be a string or null$"),
])
def test_error_messages_give_one_fix(bad: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        rb.from_config(bad)


@pytest.mark.parametrize(("name", "text", "match"), [
    ("empty.yaml", "", r"config file .*empty\.yaml is empty: expected a mapping of buffer "
                       r"arguments .*e\.g\. capacity: 100000$"),
    ("comment.yml", "# nothing yet\n", r"config file .*comment\.yml is empty"),
    ("list.json", "[1, 2]", r"config file .*list\.json holds \[1, 2\]: expected a mapping"),
    ("text.yaml", "capacity 64\n", r"config file .*text\.yaml holds 'capacity 64': expected"),
])
def test_a_file_without_a_mapping_is_named(tmp_path: Path, name: str, text: str,
                                           match: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=match):
        rb.from_config(tmp_path / name)


@pytest.mark.parametrize(("name", "text"), [
    ("twice.yaml", "capacity: 1000\nn_step: 3\ncapacity: 2000\n"),
    ("twice.json", '{"capacity": 1000, "n_step": 3, "capacity": 2000}'),
    ("nested.yaml", "capacity: 8\nsampler:\n  type: prioritized\n  alpha: 0.5\n  alpha: 0.7\n"),
    ("section.yml", "buffer:\n  capacity: 8\n  capacity: 16\ntrainer:\n  lr: 0.001\n"),
])
def test_a_key_given_twice_in_a_file_is_refused(tmp_path: Path, name: str, text: str) -> None:
    """YAML and JSON parsers keep the last of two equal keys: the first line of a file,
    edited, would change nothing. The file is refused, naming the key (and its lines)."""
    (tmp_path / name).write_text(text)
    key = "alpha" if name.startswith("nested") else "capacity"
    lines = {"twice.yaml": " (lines 1 and 3)", "nested.yaml": " (lines 4 and 5)",
             "section.yml": " (lines 2 and 3)"}.get(name, "")
    with pytest.raises(ConfigError, match=re.escape(
            f"{name}: key {key!r} is given twice{lines}; keep one")):
        rb.from_config(tmp_path / name)


def test_a_directory_is_not_called_missing(tmp_path: Path) -> None:
    folder = tmp_path / "configs.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError, match=r"configs\.yaml is a directory: pass the file, e\.g\. "
                                          r".*configs\.yaml/buffer\.yaml$"):
        rb.from_config(folder)
    (folder / "replay.yaml").write_text("capacity: 8\n")
    with pytest.raises(ConfigError, match=r"is a directory; it holds replay\.yaml: pass the "
                                          r"file, e\.g\. .*configs\.yaml/replay\.yaml$"):
        rb.from_config(str(folder))
    assert rb.from_config(folder / "replay.yaml").capacity == 8


def test_a_file_that_is_not_utf8_or_cannot_be_read_is_one_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("capacity: 8  # caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin\.yaml is not UTF-8 text \(byte 0xe9 at "
                                          r"offset 18\); save it as UTF-8$"):
        rb.from_config(latin)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"capacity": 8}')  # Notepad's byte order mark
    assert rb.from_config(bom).capacity == 8

    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(ConfigError, match=r"bom\.json: cannot read it \(Permission denied\)$"):
        rb.from_config(bom)


def test_a_buffer_section_that_is_no_mapping_is_named(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("buffer: 100000\ntrainer: {lr: 0.001}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: buffer=100000: the buffer section must "
                                          r"be a mapping of buffer arguments, e\.g\. buffer: "
                                          r"\{capacity: 100000\}$"):
        rb.from_config(tmp_path / "c.yaml")


@pytest.mark.parametrize(("bad", "match"), [
    ({"sampler": "prioritized"}, r"sampler='prioritized': must be a mapping of the sampler's type "
     r"and arguments; write sampler: \{type: prioritized\} \(YAML\) or \"sampler\": \{\"type\": "
     r"\"prioritized\"\} \(JSON\), its arguments beside type$"),
    ({"sampler": "PrioritizedSampler"}, r"sampler='PrioritizedSampler': .*write sampler: "
                                        r"\{type: prioritized\} \(YAML\)"),
    ({"view": "nstep"}, r"view='nstep': must be a mapping of the view's type .*view: "
                        r"\{type: nstep\} \(YAML\)"),
    ({"sampler": ["uniform"]}, r"sampler=\['uniform'\]: must be a mapping .*\{type: \.\.\.\} "
                               r"\(YAML\).* \(known types: \['lane_split', 'prioritized'"),
    # a nested sampler too: the form a config writes it in
    ({"sampler": {"type": "recent", "prioritized": True}},
     r"RecentSampler\(prioritized=True\): expected a PrioritizedSampler or None; pass "
     r"prioritized=PrioritizedSampler\(alpha=0\.6\) \(in a config: prioritized: "
     r"\{type: prioritized, alpha: 0\.6\}\)$"),
])
def test_a_sampler_or_view_written_as_a_name_says_how_to_write_it(bad: dict[str, Any],
                                                                  match: str) -> None:
    """``sampler: prioritized`` is what a reader of "names its sampler by its registered
    name" writes first; the error shows the mapping to write instead."""
    with pytest.raises(ConfigError, match=match):
        rb.from_config({"capacity": 8, **bad})
    nested = rb.from_config({"capacity": 8, "sampler": {
        "type": "recent", "prioritized": {"type": "prioritized", "alpha": 0.6}}})
    assert nested.config().sampler.prioritized["alpha"] == 0.6
