"""``replaybank.__all__`` is exactly the public API, and importing it stays light."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys

import replaybank as rb

# user-facing layers: every class their modules export must be exported at the top
USER_FACING = ("replaybank.buffers", "replaybank.samplers", "replaybank.views",
               "replaybank.storage", "replaybank.errors", "replaybank.batch",
               "replaybank.spec", "replaybank.device", "replaybank.shared")
# classes of those layers that are internal machinery, not something users import
INTERNAL = {
    "replaybank.buffers.guard.CallGuard",
    "replaybank.buffers.one_thread.ThreadCheck",  # a rollout buffer's part, not built by users
    "replaybank.buffers.one_thread.Checked",
    "replaybank.buffers.writer.Writer",
    "replaybank.buffers.write_route.WriteRoute",
    "replaybank.samplers.windows.WindowRequest",
    "replaybank.buffers.sequences.WindowUpdates",  # what the client and one buffer check
    "replaybank.buffers.writer.StepValues",
    "replaybank.storage.writers.compiled.CompiledWriter",
    "replaybank.storage.table.StepTable",
    "replaybank.buffers.rollout.inputs.FinalObsStore",
    "replaybank.buffers.rollout.rollout_state.ParsedState",
    "replaybank.storage.side_store.SideStore",
    "replaybank.storage.writers.layouts.ObsLayout",
    "replaybank.storage.writers.layouts.RowsLayout",
    "replaybank.storage.writers.plan.WritePlan",
    "replaybank.storage.writers.reference.StepWriter",
    "replaybank.storage.writers.tell.RangeListener",
    "replaybank.storage.writers.tell.WriteListener",
    "replaybank.samplers.base.SamplerTraits",
    "replaybank.buffers.sampling_parts.Parts",
    "replaybank.buffers.checked_call.CheckedCall",
    # device replay parts (issue 17): composed by ReplayBuffer, never built by users
    "replaybank.device.path.DeviceArrays",
    "replaybank.device.path.DevicePath",
    "replaybank.device.mirror.DeviceMirror",
    "replaybank.device.hindsight.Relabeling",
    "replaybank.storage.newest_steps.NewestSteps",
    "replaybank.shared.reader.SharedReader",
    "replaybank.shared.backend.SharedLayout",
    "replaybank.shared.lanes.LaneSnapshot",
    "replaybank.shared.lanes.SnapshotDelta",
}
HEAVY = ("torch", "gymnasium", "ray", "matplotlib", "rich", "pydantic")
#: Subpackages in ``__all__`` (``rb.distributed``: imported on first access, ray later)
SUBPACKAGES = {"distributed"}


def test_all_is_sorted_unique_and_public() -> None:
    names = list(rb.__all__)
    assert names == sorted(set(names))
    assert all(not n.startswith("_") for n in names)


def test_every_name_in_all_resolves() -> None:
    for name in rb.__all__:
        obj = getattr(rb, name)  # lazy names import their module here
        assert obj is not None, name
        assert inspect.ismodule(obj) == (name in SUBPACKAGES), name


def test_namespace_has_no_public_name_outside_all() -> None:
    public = {n for n in dir(rb) if not n.startswith("_")
              and not inspect.ismodule(getattr(rb, n))}
    assert public <= set(rb.__all__), sorted(public - set(rb.__all__))


def test_user_facing_classes_are_exported() -> None:
    missing = []
    for mod_info in pkgutil.walk_packages(rb.__path__, "replaybank."):
        name = mod_info.name
        if not name.startswith(USER_FACING) or mod_info.ispkg:
            continue
        try:
            mod = importlib.import_module(name)
        except ImportError:  # an optional dependency is missing: nothing to check
            continue
        for attr in getattr(mod, "__all__", []):
            obj = getattr(mod, attr)
            if inspect.isclass(obj) and obj.__module__ == name \
                    and f"{name}.{attr}" not in INTERNAL and attr not in rb.__all__:
                missing.append(f"{name}.{attr}")
    assert not missing, f"public classes missing from replaybank.__all__: {missing}"


def test_exported_objects_are_the_defining_ones() -> None:
    for name in ("ReplayBuffer", "Batch", "Spec", "FieldSpec", "UniformSampler",
                 "TransitionView", "ShapeError"):
        obj = getattr(rb, name)
        mod = importlib.import_module(obj.__module__)
        assert getattr(mod, name) is obj


def test_import_is_light() -> None:
    code = (
        "import json, sys; import replaybank as rb; "
        "buf = rb.ReplayBuffer(capacity=8, seed=0); "
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
