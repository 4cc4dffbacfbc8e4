"""``replaybank.host``: the one torch-to-host conversion (is_tensor, tensor_to_numpy,
as_numpy) on the tensors users hand in and on everything else."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from replaybank.host import as_numpy, is_tensor, tensor_to_numpy

torch = pytest.importorskip("torch")


def test_is_tensor_tells_tensors_from_everything_else() -> None:
    assert is_tensor(torch.zeros(2))
    assert is_tensor(torch.nn.Parameter(torch.zeros(2)))
    assert is_tensor(torch.zeros((), dtype=torch.int64))
    for other in (np.zeros(2), [1.0], 1.0, None, "x", np.float32(1)):
        assert not is_tensor(other), other


def test_plain_cpu_tensor_is_viewed_without_a_copy() -> None:
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    a = tensor_to_numpy(t)
    assert isinstance(a, np.ndarray) and a.shape == (2, 3) and a.dtype == np.float32
    a[0, 0] = 9.0
    assert float(t[0, 0]) == 9.0  # shares memory
    assert np.shares_memory(as_numpy(t), a)


def test_requires_grad_tensor_is_detached() -> None:
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    a = tensor_to_numpy(t * 3)
    assert a.tolist() == [3.0, 6.0] and a.dtype == np.float32
    assert as_numpy(t).tolist() == [1.0, 2.0]


def test_conjugate_and_negative_views_are_resolved() -> None:
    z = torch.tensor([1 + 2j, 3 - 1j])
    c = z.conj()
    assert c.is_conj()
    assert tensor_to_numpy(c).tolist() == [1 - 2j, 3 + 1j]
    n = torch._neg_view(z)
    assert n.is_neg()
    assert tensor_to_numpy(n).tolist() == [-1 - 2j, -3 + 1j]
    assert as_numpy(c).tolist() == [1 - 2j, 3 + 1j]


def test_bfloat16_becomes_float32_exactly() -> None:
    t = torch.tensor([1.5, -2.25, 3.0e3], dtype=torch.bfloat16)
    a = tensor_to_numpy(t)
    assert a.dtype == np.float32
    assert a.tolist() == t.to(torch.float32).tolist()
    g = torch.ones(2, dtype=torch.bfloat16, requires_grad=True)
    assert as_numpy(g).dtype == np.float32 and as_numpy(g).tolist() == [1.0, 1.0]


def test_dtypes_and_shapes_are_kept() -> None:
    for dtype, want in ((torch.uint8, np.uint8), (torch.int64, np.int64),
                        (torch.bool, np.bool_), (torch.float64, np.float64)):
        a = tensor_to_numpy(torch.zeros((2, 1, 3), dtype=dtype))
        assert a.dtype == want and a.shape == (2, 1, 3)
    assert tensor_to_numpy(torch.tensor(5)).shape == ()


def test_non_tensors_go_through_asarray() -> None:
    x = np.arange(3)
    assert as_numpy(x) is x
    assert as_numpy([1, 2]).tolist() == [1, 2]
    assert as_numpy(1.5).shape == ()
    assert as_numpy([[True], [False]]).dtype == np.bool_


@pytest.mark.parametrize("value", [np.zeros(2), [1.0], 3, None])
def test_tensor_to_numpy_refuses_a_non_tensor_naming_it(value: object) -> None:
    with pytest.raises(TypeError, match=r"tensor_to_numpy\(.*\): expected a torch tensor"):
        tensor_to_numpy(value)


def test_host_imports_no_torch() -> None:
    code = ("import sys, numpy as np\n"
            "from replaybank.host import as_numpy, is_tensor, tensor_to_numpy\n"
            "assert not is_tensor(np.zeros(1)) and as_numpy([1]).tolist() == [1]\n"
            "try:\n    tensor_to_numpy([1])\nexcept TypeError:\n    pass\n"
            "else:\n    raise SystemExit('no TypeError')\n"
            "assert 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("make", [lambda: torch.zeros(3, device="meta"),
                                  lambda: torch.ones(3).to_sparse()],
                         ids=["meta", "sparse"])
@pytest.mark.parametrize("first", [True, False], ids=["first add", "later add"])
def test_a_tensor_without_host_values_is_refused_naming_the_argument(make: object,
                                                                    first: bool) -> None:
    """A meta or sparse tensor as ``obs``: a DtypeError naming ``obs`` and the fix (not
    torch's own error), on the first add (which infers the spec) and on a later one, with
    nothing stored."""
    import replaybank as rb
    from replaybank.errors import DtypeError

    buf = rb.ReplayBuffer(8, seed=0)
    step = {"action": 0, "reward": 0.0, "next_obs": np.zeros(3, np.float32),
            "terminated": False, "truncated": False}
    if not first:
        buf.add(obs=np.zeros(3, np.float32), **step)
    before = None if first else buf.state_dict()
    with pytest.raises(DtypeError, match=r"^obs=Tensor\(.*pass a dense tensor that holds"):
        buf.add(obs=make(), **step)  # type: ignore[operator]
    assert len(buf) == (0 if first else 1)
    if before is not None:
        after = buf.state_dict()
        for k, v in before["table"].items():
            assert np.asarray(v).tobytes() == np.asarray(after["table"][k]).tobytes(), k


def test_a_bfloat16_first_value_makes_a_float32_field() -> None:
    """Spec inference from a bfloat16 tensor (a mixed-precision policy's action): the
    field is float32, which holds every bfloat16 value exactly, and the values stored are
    those of the tensor."""
    import replaybank as rb

    act = torch.tensor([0.5, -1.25, 3.0e38], dtype=torch.bfloat16)
    buf = rb.ReplayBuffer(8, seed=0)
    buf.add(obs=np.zeros(2, np.float32), action=act, reward=0.0,
            next_obs=np.ones(2, np.float32), terminated=False, truncated=False)
    buf.add(obs=np.ones(2, np.float32), action=act * 2, reward=0.0,
            next_obs=np.ones(2, np.float32), terminated=False, truncated=False)
    assert buf.spec["action"].dtype == np.float32
    stored = buf.table.arrays["action"][:2, 0]
    np.testing.assert_array_equal(stored, np.stack([act.float().numpy(),
                                                    (act * 2).float().numpy()]))


@pytest.mark.parametrize("first", [True, False], ids=["first add", "later add"])
def test_a_ragged_value_is_refused_naming_the_argument_and_the_dict_to_pass(
        first: bool) -> None:
    """A tuple of unlike arrays as ``obs`` (a gymnasium Tuple space's value): a ShapeError
    naming ``obs`` and the dict form (the tuple rule, ``spec.check_tuple``), not numpy's
    "inhomogeneous shape" ValueError, on the first add (which infers the spec) and on a
    later one (a flat obs field); nothing stored. The dict form it names is stored."""
    import replaybank as rb
    from replaybank.errors import ShapeError

    buf = rb.ReplayBuffer(8, seed=0)
    step = {"action": 0, "reward": 0.0, "terminated": False, "truncated": False}
    ragged = (np.zeros(2, np.float32), np.ones(1, np.int64))
    if not first:
        buf.add(obs=np.zeros(3, np.float32), next_obs=np.ones(3, np.float32), **step)
    with pytest.raises(ShapeError, match=r"^obs=\(.*a tuple holding arrays.*obs=\{'0': obs\[0\]"):
        buf.add(obs=ragged, next_obs=ragged, **step)
    assert len(buf) == (0 if first else 1)
    if first:
        buf.add(obs={"0": ragged[0], "1": ragged[1]},
                next_obs={"0": ragged[0], "1": ragged[1]}, **step)
        assert buf.sample(1).obs["1"].dtype == np.int64


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_a_ragged_flag_on_a_one_env_first_extend_is_named(flag: str) -> None:
    """A one-env buffer's first call reads the flags' shape to tell ``[n]`` from
    ``[n, 1]`` (inputs.one_env_lead) with np.shape, so a ragged ``terminated`` (or
    ``truncated`` with no ``terminated``) was numpy's bare ValueError naming nothing. It is
    the one ragged check's ShapeError naming the flag, as a later call's; nothing is
    stored and no spec is implied."""
    import replaybank as rb
    from replaybank.errors import ShapeError

    buf = rb.ReplayBuffer(8, seed=0)
    steps = {
        "obs": np.zeros((2, 1, 3), np.float32),
        "action": np.zeros((2, 1)),
        "reward": np.zeros((2, 1)),
        "next_obs": np.ones((2, 1, 3), np.float32),
        "terminated": np.zeros((2, 1), bool),
        "truncated": np.zeros((2, 1), bool),
    }
    if flag == "truncated":
        del steps["terminated"]
    said = rf"^{flag}=\[\[False\], \[False, True\]\]: a ragged nest"
    with pytest.raises(ShapeError, match=said):
        buf.extend(**{**steps, flag: [[False], [False, True]]})
    assert len(buf) == 0 and buf.spec is None


@pytest.mark.parametrize("call", ["add", "extend"])
def test_ragged_env_ids_are_named(call: str) -> None:
    """``env_ids`` were read with np.asarray (checked_call.lane_ids), so a ragged list was
    numpy's bare ValueError naming nothing; it is the one ragged check's ShapeError
    naming ``env_ids``, and nothing changes."""
    import replaybank as rb
    from replaybank.errors import ShapeError

    buf = rb.ReplayBuffer(8, num_envs=2, seed=0)
    step = {
        "obs": np.zeros((2, 3), np.float32),
        "action": [0, 1],
        "reward": [0.0, 0.0],
        "next_obs": np.ones((2, 3), np.float32),
        "terminated": [False, False],
        "truncated": [False, False],
    }
    buf.add(**step)
    before = buf.state_dict()
    values = step if call == "add" else {k: [v] for k, v in step.items()}
    said = r"^env_ids=\[\[0\], \[0, 1\]\]: a ragged nest, rows of different lengths \(\[1\]"
    with pytest.raises(ShapeError, match=said):
        getattr(buf, call)(**values, env_ids=[[0], [0, 1]])
    assert len(buf) == 2
    after = buf.state_dict()
    for k, v in before["table"].items():
        assert np.asarray(v).tobytes() == np.asarray(after["table"][k]).tobytes(), k


#: what every boundary says of the ragged list ``[[0.0, 1.0], [2.0]]``
RAGGED_SAID = (r": a ragged nest, rows of different lengths \(\[1\] has shape \(1,\) but \[0\] "
               r"has shape \(2,\)\); expected ")


@pytest.mark.parametrize("call", ["first add", "later add", "update_priorities",
                                  "extend(priority=)"])
def test_a_ragged_list_gets_one_error_at_every_boundary(call: str) -> None:
    """The add boundary (``host.as_numpy``) and the rows of priorities (``spec.rows_array``)
    had two ragged checks with two messages ("a ragged nest numpy cannot make one array
    of (<numpy's text>)", "rows of different lengths"); there is one, which names the
    argument, its value, the first row whose shape differs, the shape expected and the
    fix, and nothing changes."""
    import replaybank as rb
    from replaybank.errors import ShapeError

    ragged = [[0.0, 1.0], [2.0]]
    buf = rb.ReplayBuffer(8, num_envs=2, seed=0, sampler=rb.PrioritizedSampler())
    step = {"obs": np.zeros((2, 2), np.float32), "action": [0, 1], "reward": [0.0, 0.0],
            "next_obs": np.ones((2, 2), np.float32), "terminated": [False, False],
            "truncated": [False, False]}
    if call != "first add":
        buf.add(**step)
    before = buf.state_dict()
    if call.endswith("add"):
        head = r"^obs=\[\[0\.0, 1\.0\], \[2\.0\]\]"
        with pytest.raises(ShapeError, match=head + RAGGED_SAID + r"one array.*\{'0': obs\[0\]"):
            buf.add(**{**step, "obs": ragged})
    elif call == "update_priorities":
        head = r"^update_priorities\(priorities=\[\[0\.0, 1\.0\], \[2\.0\]\]\)"
        with pytest.raises(ShapeError, match=head + RAGGED_SAID + r"\[B=2\]"):
            buf.update_priorities([0, 1], ragged)
    else:
        head = r"^priority=\[\[0\.0, 1\.0\], \[2\.0\]\]"
        with pytest.raises(ShapeError, match=head + RAGGED_SAID + "one priority per step"):
            buf.extend(**{k: [v] for k, v in step.items()}, priority=ragged)
    after = buf.state_dict()
    assert len(buf) == (0 if call == "first add" else 2)
    if call != "first add":
        np.testing.assert_array_equal(after["sampler"]["priorities"],
                                      before["sampler"]["priorities"])
