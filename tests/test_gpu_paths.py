"""GPU paths of the runtime and the controller, through FakeTF (TensorFlow's rules, no GPU needed).

The controller is driven as the magic drives it: `ctl.edit([ctl.parse(line), ...])`. What counts is
what TensorFlow would really run with once initialized (`FakeTF.in_force()`), and that a policy
TensorFlow can no longer take is reported as locked, with nothing touched.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Callable

import pytest

from fake_tf import FakeTF, InForce, SeamMisuse, cuda_visible_ids, fake_uuid
from tfgpu_magic import importhooks
from tfgpu_magic.tf import quietimport
from tfgpu_magic.views import status
from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import Gpu, Inventory, InventoryCatalog
from tfgpu_magic.plan import Plan
from tfgpu_magic.tf.apply import ApplyReport, Change, Refusal, apply_plan
from tfgpu_magic.tf.runtime import CreatedBy, where
from tfgpu_magic.views.status import note_text
from tfgpu_magic.views.tfstate import place_text, state_text as status_state_text

GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"
STARTS = ("before import", "imported", "devices listed")
"""Where TensorFlow is when the %tfgpu cell runs."""


@pytest.fixture(autouse=True)
def clean_process():
    """Disarm the real import hook the controller arms; the fake path must never import TensorFlow."""
    had_tf = "tensorflow" in sys.modules
    yield
    quietimport.disarm()
    assert had_tf or "tensorflow" not in sys.modules, "a FakeTF test imported TensorFlow"


# ----- helpers ----------------------------------------------------------------------------------
def session(gpus: int, start: str = "imported", env: dict | None = None) -> tuple[FakeTF, Controller]:
    """A fake TensorFlow at `start` and a controller sharing its environment."""
    env = {} if env is None else env
    fake = FakeTF(gpus, imported=start != "before import", environ=env)
    if start == "devices listed":
        fake.list_devices()
    return fake, Controller(api=fake, environ=env, catalog=catalog(fake))


def catalog(fake: FakeTF) -> InventoryCatalog:
    """The GPU inventory (NVML's view) of the fake's machine: 16 GiB cards, nvidia-smi order."""
    gpus = tuple(Gpu(index, uuid, memory_total_mib=16384) for index, uuid in enumerate(fake.uuids))
    return InventoryCatalog(Inventory(gpus=gpus))


def edit(ctl: Controller, *lines: str) -> ApplyReport:
    """What `%tfgpu LINE` / a `%%tfgpu` cell does."""
    return ctl.edit([ctl.parse(line) for line in lines])


def worded(items: list[Change | Refusal | str], route: CreatedBy | None = None) -> list[str]:
    """A report's records as the messages word them (`views.status`; `route`: what created the GPU
    devices, as the report's state says); lines stay as they are."""
    return [status.item_text(item, route) for item in items]


def import_tensorflow(fake: FakeTF) -> None:
    """`import tensorflow` with the controller's hook armed: TF loads, then the hook's callback runs."""
    hook = next(f for f in sys.meta_path if importhooks.is_hook(f) and f.target == quietimport.TARGET)
    quietimport.disarm()
    fake.imported = True
    hook.callback()


def run_cell(fake: FakeTF, ctl: Controller, *lines: str) -> list[ApplyReport]:
    """Run a %tfgpu cell, then `import tensorflow` if it was not imported: the reports of both."""
    reports = [edit(ctl, *lines)]
    if not fake.imported:
        import_tensorflow(fake)
        reports.append(ctl.last_report)
    return reports


def gpus_in_force(in_force: InForce) -> list[tuple[int, bool, tuple[int, ...] | None]]:
    """(machine GPU id, growth, MiB of each logical GPU or None) per visible GPU, TF order."""
    return [(gpu.cuda_id, gpu.growth, gpu.limits) for gpu in in_force.gpus]


def setters(fake: FakeTF, kind: str) -> list[tuple]:
    return [call for call in fake.calls if call[0] == kind]


# ----- the fake's own GPU rules (copied from context.py; CPU TensorFlow cannot show them) -------------
def _gpu(fake: FakeTF, index: int):
    return fake.devices("GPU")[index]


def _growth_everywhere(fake: FakeTF) -> None:
    for gpu in fake.devices("GPU"):
        fake.set_growth(gpu, True)


RULES = {
    "growth on a GPU with logical devices": (
        lambda f: f.set_logical(_gpu(f, 0), [1024]),
        lambda f: f.set_growth(_gpu(f, 0), True),
        ValueError, "Cannot set memory growth on device when virtual devices configured",
    ),
    "GPU logical device without memory_limit": (
        lambda f: None,
        lambda f: f.set_logical(_gpu(f, 1), [1024, None]),
        ValueError, "Setting memory limit is required for GPU virtual devices",
    ),
    "growth changed after init": (
        lambda f: f.initialize(),
        lambda f: f.set_growth(_gpu(f, 0), True),
        RuntimeError, "Physical devices cannot be modified after being initialized",
    ),
    "GPU split changed after init": (
        lambda f: (f.set_logical(_gpu(f, 0), [512]), f.initialize()),
        lambda f: f.set_logical(_gpu(f, 0), [512, 512]),
        RuntimeError, "Virtual devices cannot be modified after being initialized",
    ),
    "GPU hidden after init": (
        lambda f: f.initialize(),
        lambda f: f.set_visible([_gpu(f, 1)], "GPU"),
        RuntimeError, "Visible devices cannot be modified after being initialized",
    ),
    "GPU listed as a CPU": (
        lambda f: None,
        lambda f: f.set_visible([_gpu(f, 0)], "CPU"),
        ValueError, "Unrecognized device: PhysicalDevice(name='/physical_device:GPU:0'",
    ),
    "differing growth at init": (
        lambda f: f.set_growth(_gpu(f, 0), True),
        lambda f: f.initialize(),
        ValueError, "Memory growth cannot differ between GPU devices",
    ),
}


@pytest.mark.parametrize("rule", RULES)
def test_fake_enforces_gpu_rule(rule: str) -> None:
    """Each GPU-only rule raises TensorFlow's error and records nothing."""
    setup, call, error, text = RULES[rule]
    fake = FakeTF(2)
    fake.list_devices()
    setup(fake)
    before = fake.snapshot()
    with pytest.raises(error, match=re.escape(text)):
        call(fake)
    assert fake.snapshot() == before


SAME_AGAIN = {
    "growth": (_growth_everywhere, lambda f: f.set_growth(_gpu(f, 0), True)),
    "default growth": (lambda f: None, lambda f: f.set_growth(_gpu(f, 1), None)),
    "split": (lambda f: f.set_logical(_gpu(f, 0), [512, 512]), lambda f: f.set_logical(_gpu(f, 0), (512, 512))),
    "visible": (lambda f: f.set_visible([_gpu(f, 1)], "GPU"), lambda f: f.set_visible([_gpu(f, 1)], "GPU")),
}


@pytest.mark.parametrize("setting", SAME_AGAIN)
def test_fake_identical_value_after_init_is_a_silent_no_op(setting: str) -> None:
    """Re-setting the recorded value succeeds even after initialization."""
    setup, again = SAME_AGAIN[setting]
    fake = FakeTF(2)
    setup(fake)
    fake.initialize()
    before = fake.snapshot()
    again(fake)
    assert fake.snapshot() == before


def _growth_and_cpu_split(fake: FakeTF) -> None:
    _growth_everywhere(fake)
    fake.set_logical(fake.devices("CPU")[0], [None, None])


def _growth_on_hidden_gpu(fake: FakeTF) -> None:
    fake.set_growth(_gpu(fake, 1), True)
    fake.set_visible([_gpu(fake, 0)], "GPU")


@pytest.mark.parametrize(
    ("setup", "env", "growth"),
    [
        pytest.param(_growth_everywhere, {}, True, id="growth"),
        pytest.param(_growth_and_cpu_split, {}, False, id="any virtual entry drops growth"),
        pytest.param(_growth_and_cpu_split, {GROWTH_ENV: "true"}, True, id="env true wins"),
        pytest.param(_growth_and_cpu_split, {GROWTH_ENV: "True"}, False, id="only exact strings count"),
        pytest.param(_growth_everywhere, {GROWTH_ENV: "false"}, False, id="env false wins"),
        pytest.param(lambda f: None, {GROWTH_ENV: "true"}, True, id="env alone"),
        pytest.param(_growth_on_hidden_gpu, {}, False, id="hidden GPU's growth ignored"),
    ],
)
def test_fake_growth_in_force(setup: Callable[[FakeTF], None], env: dict, growth: bool) -> None:
    """Growth in force follows _compute_device_options and TF_FORCE_GPU_ALLOW_GROWTH read at init."""
    fake = FakeTF(2, environ=env)
    setup(fake)
    assert {gpu.growth for gpu in fake.initialize().gpus} == {growth}


def test_fake_failed_init_stays_uninitialized() -> None:
    """A ValueError at init leaves the runtime uninitialized: fixing growth then works."""
    fake = FakeTF(2)
    fake.set_growth(_gpu(fake, 0), True)
    with pytest.raises(ValueError, match="Memory growth cannot differ"):
        fake.initialize()
    assert not fake.state().initialized
    fake.set_growth(_gpu(fake, 1), True)
    assert [gpu.growth for gpu in fake.initialize().gpus] == [True, True]


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        (None, [0, 1, 2, 3]), ("", []), ("2,0", [2, 0]), ("1,x,3", [1]), ("1,7,2", [1]), ("3,3", [3]),
        (f"{fake_uuid(3)},1", [3, 1]), ("GPU-2,gpu-0", [2, 0]), ("GPU-,1", []), ("0,GPU-9", [0]),
    ],
)
def test_fake_cuda_visible_devices(value: str | None, ids: list[int]) -> None:
    """CUDA_VISIBLE_DEVICES: indices and UUID prefixes in order; parsing stops at the first invalid entry."""
    assert cuda_visible_ids(value, [fake_uuid(i) for i in range(4)]) == ids


def test_fake_reads_cuda_env_once_when_devices_are_listed() -> None:
    """A CUDA_VISIBLE_DEVICES change after the first listing is too late."""
    env = {"CUDA_VISIBLE_DEVICES": "1,3"}
    fake = FakeTF(4, environ=env)
    assert [fake.name(d) for d in fake.devices("GPU")] == ["GPU:0", "GPU:1"]
    env["CUDA_VISIBLE_DEVICES"] = "0"
    assert [gpu.cuda_id for gpu in fake.initialize().gpus] == [1, 3]


def test_fake_refuses_tf_config_before_import() -> None:
    """Using the seam before TensorFlow is imported is a bug of the code under test."""
    with pytest.raises(SeamMisuse):
        FakeTF(1, imported=False).devices("GPU")


# ----- policies: what is in force after the first op -------------------------------------------------
@dataclass(frozen=True)
class Case:
    gpus: int
    lines: tuple[str, ...]
    want: list[tuple[int, bool, tuple[int, ...] | None]]
    """`gpus_in_force` after initialization."""
    cpus: int = 1
    env: dict = field(default_factory=dict)
    """Environment before the cell (as the kernel inherited it)."""


CASES = {
    "growth on all GPUs": Case(2, ("growth on",), [(0, True, None), (1, True, None)]),
    "growth + limit on one": Case(2, ("growth on", "limit 2GB 0"), [(0, True, (2048,)), (1, True, None)]),
    "limit on all GPUs": Case(3, ("limit 3GB",), [(0, False, (3072,)), (1, False, (3072,)), (2, False, (3072,))]),
    "limit on one GPU": Case(2, ("limit 1GB 1",), [(0, False, None), (1, False, (1024,))]),
    "split one GPU in 2": Case(2, ("split 0 2x2GB",), [(0, False, (2048, 2048)), (1, False, None)]),
    "visible subset": Case(4, ("visible 1,3",), [(1, False, None), (3, False, None)]),
    "visible + limit": Case(4, ("visible 2,3", "limit 1GB 3"), [(2, False, None), (3, False, (1024,))]),
    "visible none": Case(2, ("visible none",), []),
    "growth + cpu split": Case(2, ("growth on", "split cpu 2"), [(0, True, None), (1, True, None)], cpus=2),
    "limit in % of each card": Case(2, ("limit 25%",), [(0, False, (4096,)), (1, False, (4096,))]),
    "visible by UUID + limit": Case(4, ("visible GPU-1,GPU-3", "limit 1GB 3"), [(1, False, None), (3, False, (1024,))]),
    "inherited CUDA_VISIBLE_DEVICES": Case(  # the grant's GPU 1 (CUDA's numbering) is the card nvidia-smi calls 3
        4, ("limit 1GB 1",), [(2, False, None), (3, False, (1024,))],
        env={"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    ),
}


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("case", CASES)
def test_policy_is_in_force_after_first_op(case: str, start: str) -> None:
    """Whenever the cell runs before the first op, TensorFlow initializes with exactly the policy."""
    spec = CASES[case]
    fake, ctl = session(spec.gpus, start, dict(spec.env))
    report = run_cell(fake, ctl, *spec.lines)[-1]
    assert report.ok, status.describe_report(report)
    in_force = fake.initialize()
    assert gpus_in_force(in_force) == spec.want
    assert in_force.cpus == spec.cpus


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("growth_first", [False, True], ids=["one cell", "growth cell first"])
def test_growth_with_limit_never_sets_growth_on_a_split_gpu(start: str, growth_first: bool) -> None:
    """Growth + limit goes through TF_FORCE_GPU_ALLOW_GROWTH=true, not set_memory_growth on GPU:0."""
    fake, ctl = session(2, start)
    cells = [("growth on",), ("limit 2GB 0",)] if growth_first else [("growth on", "limit 2GB 0")]
    reports = [report for cell in cells for report in run_cell(fake, ctl, *cell)]
    assert all(report.failed == [] for report in reports)  # the fake raises on growth of a split GPU
    assert ctl.environ[GROWTH_ENV] == "true"
    assert any(GROWTH_ENV in note for report in reports for note in map(note_text, report.notes))
    growth_calls = [("set_growth", "GPU:0", True), ("set_growth", "GPU:1", True)] if growth_first else []
    assert setters(fake, "set_growth") == growth_calls
    assert [gpu.growth for gpu in fake.initialize().gpus] == [True, True]


@pytest.mark.parametrize(
    ("start", "env_cvd", "set_visible_calls"),
    [
        ("before import", "1,3", []),
        ("imported", "1,3", []),
        ("devices listed", None, [("set_visible", ["GPU:1", "GPU:3"], "GPU")]),
    ],
)
def test_visible_subset_uses_env_until_cuda_starts(start: str, env_cvd: str | None, set_visible_calls: list) -> None:
    """Before CUDA starts GPUs are hidden by CUDA_VISIBLE_DEVICES; after, by set_visible_devices."""
    fake, ctl = session(4, start)
    reports = run_cell(fake, ctl, "visible 1,3")
    assert ctl.environ.get("CUDA_VISIBLE_DEVICES") == env_cvd
    assert setters(fake, "set_visible") == set_visible_calls
    assert any("set_visible_devices" in note for report in reports for note in map(note_text, report.notes)) == bool(set_visible_calls)


def test_policy_before_import_waits_for_the_import_hook() -> None:
    """Before import only the environment changes; the hook applies the rest right after import."""
    fake, ctl = session(2, "before import")
    report = edit(ctl, "growth on", "limit 1GB 1")
    assert report.waiting and quietimport.is_armed()
    assert fake.calls == [] and ctl.environ[GROWTH_ENV] == "true"
    assert "when TensorFlow is imported" in status.describe_report(report)
    assert "not imported" in status.describe_status(ctl)
    import_tensorflow(fake)
    assert not quietimport.is_armed()
    assert fake.calls == [("set_logical", "GPU:1", (1024,))]
    assert ctl.last_report.ok and ctl.last_report.applied


# ----- after initialization ------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_same_policy_after_init_is_ok_and_touches_nothing(case: str) -> None:
    """Re-running the config cell after the first op: ok, nothing locked, no tf.config call."""
    spec = CASES[case]
    fake, ctl = session(spec.gpus, "imported", dict(spec.env))
    run_cell(fake, ctl, *spec.lines)
    fake.initialize()
    before, calls, env = fake.snapshot(), len(fake.calls), dict(ctl.environ)
    [report] = run_cell(fake, ctl, *spec.lines)
    assert report.ok and report.locked == [] and report.applied == []
    assert "Already in force" in status.describe_report(report)
    assert (fake.snapshot(), len(fake.calls), ctl.environ) == (before, calls, env)


def test_hand_configured_growth_is_recognised_after_init() -> None:
    """Growth set by the user's own tf.config code, then `%tfgpu growth on` after init: ok."""
    fake, ctl = session(2)
    _growth_everywhere(fake)
    fake.initialize()
    assert edit(ctl, "growth on").ok


CHANGES = {
    "growth off": (("growth on",), ("growth off",), ["memory growth of GPU:0: on → off", "memory growth of GPU:1"]),
    "add a limit": ((), ("limit 2GB 0",), ["logical devices of GPU:0: TF default → 2GB"]),
    "growth + limit": (("growth on",), ("limit 2GB 0",), [f"{GROWTH_ENV}: unset → true", "logical devices of GPU:0"]),
    "hide a GPU": ((), ("visible 0",), ["visible GPUs: GPU:0, GPU:1 → GPU:0"]),
    "other split": (("split 1 2x1GB",), ("split 1 3x1GB",), ["logical devices of GPU:1: 1GB + 1GB →"]),
    "cpu split": (("split cpu 2",), ("split cpu 3",), ["logical CPU devices: 2 logical devices → 3"]),
}


@pytest.mark.parametrize("change", CHANGES)
def test_different_policy_after_init_is_locked_and_changes_nothing(change: str) -> None:
    """After the first op every differing setting is reported locked, and nothing at all changes."""
    first, second, locked = CHANGES[change]
    fake, ctl = session(2)
    if first:
        edit(ctl, *first)
    fake.initialize()
    before, calls, env = fake.snapshot(), len(fake.calls), dict(ctl.environ)
    report = edit(ctl, *second)
    assert report.applied == [] and report.failed == [] and not report.ok
    assert len(report.locked) == len(locked)
    assert all(want in item for want, item in zip(locked, worded(report.locked))), report.locked
    assert (fake.snapshot(), len(fake.calls), ctl.environ) == (before, calls, env)
    text = status.describe_report(report)
    assert status.RESTART_HINT in text and all(item in text for item in worded(report.locked))
    state_text = status.describe_status(ctl)
    assert status_state_text(fake.state()) in state_text
    assert all(item in state_text for item in worded(report.locked))  # the variables too: message and status agree


@pytest.mark.parametrize(
    ("first", "second", "locked"),
    [("growth on", "growth on", False), ("growth on", "growth off", True), ("limit 1GB 0", "limit 2GB 0", True)],
)
def test_unreadable_state_falls_back_to_tensorflow_refusal(first: str, second: str, locked: bool) -> None:
    """If TF's private state ever reads 'not initialized', the setters' RuntimeError still means locked."""
    fake = FakeTF(2, state_readable=False)
    ctl = Controller(api=fake, environ={}, catalog=catalog(fake))
    edit(ctl, first)
    fake.initialize()
    before = fake.snapshot()
    report = edit(ctl, second)
    assert (bool(report.locked), report.applied, report.failed) == (locked, [], [])
    assert fake.snapshot() == before


def test_tensorflow_value_error_is_reported_and_other_steps_still_apply() -> None:
    """A step TensorFlow refuses lands in report.failed with TF's words; the others are applied."""
    fake = FakeTF(3)
    # two logical GPUs without a memory limit: TF refuses (a single `(None,)` is the whole GPU, TF's default)
    plan = Plan(visible_gpus=(0, 2), tf_limits=((0, (None, None)), (2, (512,))), tf_indices=(("0", 0), ("2", 2)),
                cpu_devices=2)
    report = apply_plan(plan, fake)
    assert len(report.failed) == 1 and report.locked == []
    assert report.failed[0] == Refusal(Change("logical", "GPU:0", None, (None, None)),
                                       "Setting memory limit is required for GPU virtual devices")
    assert worded(report.failed) == ["logical devices of GPU:0: TF default → 2 logical devices: TensorFlow said: "
                                     "Setting memory limit is required for GPU virtual devices"]
    applied = [item.split(":")[0] for item in worded(report.applied)]
    assert applied == ["visible GPUs", "logical devices of GPU", "logical CPU devices"]
    in_force = fake.initialize()
    assert gpus_in_force(in_force) == [(0, False, None), (2, False, (512,))] and in_force.cpus == 2
    text = status.describe_report(report)
    assert "TensorFlow refused part of the policy" in text and "Setting memory limit is required" in text


def test_recorded_settings_show_what_tensorflow_holds() -> None:
    """The status lists each GPU's recorded growth, split and visibility."""
    fake, ctl = session(3, "devices listed")
    edit(ctl, "visible 0,2", "split 2 2x1GB")
    text = status.describe_status(ctl)
    assert "GPU:1: memory growth TF default, whole GPU, hidden" in text
    assert "GPU:2: memory growth TF default, logical GPUs 1GB + 1GB" in text


# ----- regressions: bugs once found through the fake --------------------------------------------
def test_limit_off_after_it_was_recorded_is_not_claimed_in_force() -> None:
    """TF cannot drop a logical config: `limit off` is reported as needing a restart, not as done; and
    the policy left wants no `CUDA_DEVICE_ORDER`, which CUDA read already: restoring it waits too."""
    fake, ctl = session(2)
    edit(ctl, "limit 2GB 0")
    report = edit(ctl, "limit off")
    assert not report.ok and report.applied == []
    assert report.locked == [Change("variable", "CUDA_DEVICE_ORDER", "PCI_BUS_ID", None, "cuda_start"),
                             Change("logical", "GPU:0", (2048,), None)]
    assert worded(report.locked) == ["CUDA_DEVICE_ORDER: PCI_BUS_ID → unset (read when CUDA started)",
                                     "logical devices of GPU:0: 2GB → TF default"]
    pending = status.describe_status(ctl).split("Pending, needs a restart:\n", 1)
    assert len(pending) == 2 and all(item in pending[1] for item in worded(report.locked))
    assert gpus_in_force(fake.initialize()) == [(0, False, (2048,)), (1, False, None)]  # what the report warned of


LEFTOVERS = {
    "cpu split removed": lambda fake, ctl: (edit(ctl, "split cpu 2"), edit(ctl, "split off cpu")),
    "limit removed": lambda fake, ctl: (edit(ctl, "limit 2GB 0"), edit(ctl, "limit off")),
    "user's own cpu split": lambda fake, ctl: fake.set_logical(fake.devices("CPU")[0], [None, None]),
}


@pytest.mark.parametrize("leftover", LEFTOVERS)
def test_growth_on_with_leftover_logical_config_is_in_force(leftover: str) -> None:
    """A recorded logical config makes TF drop allow_growth: growth then goes through the env."""
    fake, ctl = session(2)
    LEFTOVERS[leftover](fake, ctl)
    edit(ctl, "growth on")
    assert ctl.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    in_force = fake.initialize()
    assert [gpu.growth for gpu in in_force.gpus] == [True, True]


def test_growth_off_after_hand_set_growth_on_one_gpu_initializes() -> None:
    """Growth set by hand on GPU:0 only, then `%tfgpu growth off`: growth is set to False on every GPU
    (TF refuses to initialize with a mix of None and False), so the first op does not fail."""
    fake, ctl = session(2)
    fake.set_growth(_gpu(fake, 0), True)
    assert edit(ctl, "growth off").ok
    assert [gpu.growth for gpu in fake.initialize().gpus] == [False, False]


def test_no_gpu_note_also_with_growth_and_cpu_split() -> None:
    """`growth on` alone says TF sees no GPU; with a CPU split as well (growth then goes through the
    environment) it says so too."""
    fake, ctl = session(0)
    report = edit(ctl, "growth on", "split cpu 2")
    assert any("sees no GPU" in note for note in map(note_text, report.notes))


# ----- routes that create GPU devices outside the eager context (GPU-only: decided by the fake) -------
def routed(gpus: int, *lines: str, env: dict | None = None) -> tuple[FakeTF, Controller]:
    """TensorFlow imported, the policy applied (which installs the route wrappers on the fake)."""
    fake, ctl = session(gpus, "imported", env)
    if lines:
        assert edit(ctl, *lines).ok
    else:
        ctl.apply()
    return fake, ctl


def test_device_lib_gets_the_policy_and_the_state_says_devices_exist() -> None:
    """GPU-only, decided by the fake: `device_lib.list_local_devices()` after `limit 2GB 0` creates
    GPU:0 with the limit (not TF's default whole-card allocator), the state names the route, and the
    eager context's later initialization runs on those same allocators."""
    fake, ctl = routed(2, "limit 2GB 0")
    devices = fake.device_lib.list_local_devices()
    assert [(d.name, d.memory_limit) for d in devices if d.device_type == "GPU"] == [("/device:GPU:0", 2048),
                                                                                      ("/device:GPU:1", 0)]
    label = status_state_text(ctl.state())
    assert label.startswith(f"GPU devices created by `device_lib.list_local_devices()` {place_text(where())}")
    assert "memory settings are fixed until restart" in label
    assert gpus_in_force(fake.initialize()) == [(0, False, (2048,)), (1, False, None)]


def test_without_the_wrapper_device_lib_fixes_tf_defaults() -> None:
    """GPU-only, decided by the fake (TensorFlow's rule as tests/fake_tf.py models it): devices created with the default
    config fix whole-card allocators; the eager context's limit is then ignored at initialization."""
    fake = FakeTF(2)
    fake.device_lib.list_local_devices()  # no policy installed: TensorFlow's default SessionOptions
    fake.set_logical(fake.devices("GPU")[1], [1024])
    assert gpus_in_force(fake.initialize()) == [(0, False, None), (1, False, None)]  # the limit is ignored


def test_change_after_a_route_created_devices_is_locked() -> None:
    """GPU-only, decided by the fake: after device_lib created the GPUs, `limit 1GB 1` and `growth on`
    are reported as needing a restart (tf.config would accept them, the allocators would not follow),
    nothing is called, and the status lists them as pending a restart."""
    fake, ctl = routed(2)
    fake.device_lib.list_local_devices()
    calls = len(fake.calls)
    report = edit(ctl, "limit 1GB 1", "growth on")
    assert report.applied == [] and len(report.locked) == 2 and not report.ok
    assert worded(report.locked, report.state.devices_created) == [
        f"{GROWTH_ENV}: unset → true (read when TensorFlow created the GPU allocators)",
        "logical devices of GPU:1: TF default → 1GB (GPU devices were created by "
        f"`device_lib.list_local_devices()` {place_text(where())})"]
    assert len(fake.calls) == calls and fake.get_logical(_gpu(fake, 1)) is None
    assert "cannot change these settings" in status.describe_report(report)
    assert "Pending, needs a restart" in status.describe_status(ctl)


def test_cpu_split_still_applies_after_a_route_created_gpu_devices() -> None:
    """GPU-only, decided by the fake: the eager context builds its own CPU devices, so a CPU split is
    not fixed by device_lib's GPU allocators; the growth it needs through TF_FORCE_GPU_ALLOW_GROWTH is."""
    fake, ctl = routed(1)
    fake.device_lib.list_local_devices()
    report = edit(ctl, "split cpu 2")
    assert report.applied == [Change("cpus", "CPU:0", None, (None, None))] and report.ok
    assert worded(report.applied) == ["logical CPU devices: TF default → 2 logical devices"]
    assert fake.initialize().cpus == 2


def test_changed_split_after_device_lib_fails_at_init_without_the_policy() -> None:
    """GPU-only, decided by the fake: a split first seen by the eager context after device_lib mapped
    GPU:1 to card 1 maps GPU:1 to card 0: TensorFlow's "mapped to multiple devices" failure at init."""
    fake = FakeTF(2)
    fake.device_lib.list_local_devices()
    fake.set_logical(_gpu(fake, 0), [1024, 1024])
    with pytest.raises(fake.errors()[0], match=r"TensorFlow device \(GPU:1\) is being mapped to multiple devices \(0 now, and 1"):
        fake.initialize()
    assert not fake.state().initialized


def test_is_gpu_available_is_named_in_the_state() -> None:
    """GPU-only, decided by the fake: the route is named after the tf.test function that called
    device_lib (framework/test_util.py calls device_lib.list_local_devices() in both)."""
    fake, ctl = routed(1, "growth on")

    def is_gpu_available() -> bool:  # the name TensorFlow's own function has
        return any(d.device_type == "GPU" for d in fake.device_lib.list_local_devices())

    assert is_gpu_available()
    assert ctl.state().devices_created == CreatedBy("tf.test.is_gpu_available()", where())
    assert gpus_in_force(fake.initialize()) == [(0, True, None)]


def test_session_config_is_merged_with_the_policy() -> None:
    """GPU-only, decided by the fake: `Session(config=ConfigProto())` gets the policy's GPU options and
    CPU count; the user's ConfigProto itself is left untouched."""
    fake, ctl = routed(2, "limit 1GB", "split cpu 2")
    mine = fake.new_session_config()
    sess = fake.Session(config=mine)
    assert [(g.cuda_id, g.limits) for g in sess.gpus_in_force()] == [(0, (1024,)), (1, (1024,))]
    assert sum(d.device_type == "CPU" for d in sess.list_devices()) == 2
    assert mine == fake.new_session_config()
    assert ctl.state().devices_created == CreatedBy("tf.compat.v1.Session()", where())


def test_session_with_own_cpu_count_wins_with_one_warning(capsys: pytest.CaptureFixture) -> None:
    """A config with its own CPU device count keeps it, and one stderr line says which wins (the fake
    lists the devices; the same CPU rule runs on real TF in test_fake_parity's `routes` scenario)."""
    fake, ctl = routed(1, "split cpu 3")
    mine = fake.new_session_config()
    mine.device_count["CPU"] = 1
    sess = fake.Session(config=mine)
    assert sum(d.device_type == "CPU" for d in sess.list_devices()) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert lines == ["tfgpu_magic: tf.compat.v1.Session(): the config's own CPU device count (1) wins over "
                     "the policy's (3) in this session"]


def test_session_with_own_gpu_options_wins_with_one_warning(capsys: pytest.CaptureFixture) -> None:
    """GPU-only, decided by the fake: a config that sets its own gpu_options keeps them (one stderr
    line says so); the state then says GPU memory is fixed, and a later init shows the user's growth."""
    fake, ctl = routed(1, "limit 1GB")
    mine = fake.new_session_config()
    mine.gpu_options.allow_growth = True
    fake.Session(config=mine)
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert lines == ["tfgpu_magic: tf.compat.v1.Session(): the config's own gpu_options (allow_growth) win over "
                     "the policy's for the GPU devices it creates; they stay fixed until restart"]
    assert ctl.state().gpu_memory_fixed
    assert gpus_in_force(fake.initialize()) == [(0, True, None)]


def test_session_without_config_uses_the_eager_context_config() -> None:
    """GPU-only, decided by the fake: `Session()` takes `context().config` (client/session.py), which
    already carries the applied policy; the wrapper passes None through."""
    fake, ctl = routed(2, "split 1 2x1GB")
    sess = fake.Session()
    assert [(g.cuda_id, g.limits) for g in sess.gpus_in_force()] == [(0, None), (1, (1024, 1024))]


def test_route_wrappers_are_idempotent_and_reversible() -> None:
    """Applying twice wraps once; `uninstall_routes` puts TensorFlow's own functions back."""
    from tfgpu_magic.tf.routes import uninstall_routes
    from tfgpu_magic.tf.runtime import WRAPPED

    fake, ctl = routed(1, "growth on")
    original = fake.device_lib.list_local_devices
    ctl.apply()
    wrapped = fake.device_lib.list_local_devices
    assert getattr(getattr(wrapped, WRAPPED), WRAPPED, None) is None
    uninstall_routes(fake)
    assert not hasattr(fake.device_lib.list_local_devices, WRAPPED)
    assert not hasattr(fake.Session.__init__, WRAPPED)
    assert getattr(original, WRAPPED) == fake.device_lib.list_local_devices


def test_cpp_failure_of_a_route_is_one_line_and_raised(capsys: pytest.CaptureFixture) -> None:
    """GPU-only, decided by the fake: a user's config with more virtual-device entries than GPUs fails
    in VerifyVirtualDeviceSettings (gpu_device.cc); the user's error surfaces, with one line naming
    whose options were used; nothing is recorded as created."""
    fake, ctl = routed(1, "growth on")
    mine = fake.new_session_config()
    for _ in range(2):
        mine.gpu_options.experimental.virtual_devices.add().memory_limit_mb.extend([512])
    with pytest.raises(fake.errors()[0], match="Not enough GPUs to create virtual devices"):
        fake.device_lib.list_local_devices(mine)
    err = capsys.readouterr().err
    assert "could not create devices with its own config: Not enough GPUs" in err
    assert ctl.state().devices_created is None


# ----- process-wide C++ rules the fake models -----------------------------------------------------------
def test_async_allocator_has_no_growth_and_soft_shared_limits() -> None:
    """GPU-only, decided by the fake (gpu_process_state.cc, read not run): under cuda_malloc_async growth
    is not in force and the limits are the pool's; the status never calls them hard nor growth on."""
    fake, ctl = session(1, "before import")
    run_cell(fake, ctl, "allocator async", "growth on", "split 0 2x1GB")
    in_force = fake.initialize()
    assert [(g.growth, g.limits, g.allocator) for g in in_force.gpus] == [(False, (1024, 1024), "cuda_malloc_async")]
    text = status.describe_status(ctl)
    assert "moot (cuda_malloc_async)" in text and "soft" in text
    assert "hard" not in text and "memory growth on" not in text
    assert not any("TF_FORCE_GPU_ALLOW_GROWTH=true" in note for note in map(note_text, ctl.plan().notes))


def test_cuda_started_by_another_library_freezes_cuda_variables() -> None:
    """GPU-only, decided by the fake: CUDA started by PyTorch before TF listed devices: `visible 1`
    goes through tf.config.set_visible_devices, CUDA_* stay untouched, the state says why."""
    env: dict = {}
    fake, ctl = session(3, "imported", env)
    fake.start_cuda()
    assert "CUDA_* changes no longer take effect" in status_state_text(ctl.state())
    [report] = run_cell(fake, ctl, "visible 1")
    assert "CUDA_VISIBLE_DEVICES" not in env and "CUDA_DEVICE_ORDER" not in env
    assert setters(fake, "set_visible") == [("set_visible", ["GPU:1"], "GPU")]
    assert [g.cuda_id for g in fake.initialize().gpus] == [1]


def test_cuda_variables_locked_once_cuda_started_elsewhere_before_import() -> None:
    """GPU-only, decided by the fake: before TF is imported, the label says CUDA_* no longer take effect."""
    fake, ctl = session(2, "before import")
    fake.start_cuda()
    assert status_state_text(ctl.state()) == (
        "not imported, but CUDA already started (libcuda is loaded in this process): "
        "CUDA_* changes no longer take effect")


def test_users_own_logical_config_with_priority_is_not_identical() -> None:
    """GPU-only, decided by the fake (context.py compares LogicalDeviceConfiguration lists with ==):
    the user's `[LogicalDeviceConfiguration(1024, experimental_priority=-1)]` is not the policy's
    `limit 1GB 0`: after init it is reported locked instead of "already in force"."""
    from tfgpu_magic.tf.runtime import LogicalSpec

    fake, ctl = session(1)
    fake.set_user_logical(_gpu(fake, 0), [LogicalSpec(1024, -1)])
    fake.initialize()
    report = edit(ctl, "limit 1GB 0")
    assert worded(report.locked) == ["logical devices of GPU:0: 1GB (priority -1) → 1GB"]


def test_user_hid_the_cpu_and_the_status_explains() -> None:
    """The policy never hides the CPU; if the user did, the status says what will fail and how to undo it."""
    fake, ctl = session(1, "devices listed")
    edit(ctl, "visible 0", "growth on")
    assert all(call[2] == "GPU" for call in setters(fake, "set_visible"))
    fake.set_visible([], "CPU")
    assert 'No CPU devices are available in this process' in status.describe_status(ctl)


def test_tf_error_while_listing_devices_is_reported_like_the_others() -> None:
    """GPU-only, decided by the fake: a C++-side error (tf.errors.*) from TensorFlow becomes a failed
    line with TF's words, not a traceback out of the import hook; nothing was applied."""
    from fake_tf import InternalError

    class Broken(FakeTF):
        def list_devices(self):  # noqa: ANN202
            raise InternalError("cudaGetDevice() failed. Status: CUDA driver version is insufficient\nmore")

    fake = Broken(1)
    report = apply_plan(Plan(growth=True), fake)
    assert worded(report.failed) == ["listing TensorFlow's devices: TensorFlow said: cudaGetDevice() failed. "
                                     "Status: CUDA driver version is insufficient"]
    assert report.applied == [] and worded(report.failed)[0] in status.describe_report(report)


def test_locked_allocator_variables_agree_between_message_and_status() -> None:
    """After init, `growth on` + a limit needs TF_FORCE_GPU_ALLOW_GROWTH=true: the change message and
    the status both list it as needing a restart, for the same reason (read when the GPU allocators
    were created)."""
    fake, ctl = session(1)
    fake.initialize()
    report = edit(ctl, "growth on", "limit 1GB 0")
    [env_item] = [item for item in worded(report.locked) if item.startswith(GROWTH_ENV)]
    assert env_item == f"{GROWTH_ENV}: unset → true (read when TensorFlow created the GPU allocators)"
    pending = status.describe_status(ctl).split("Pending, needs a restart:\n", 1)
    assert len(pending) == 2 and env_item in pending[1]


@pytest.mark.parametrize(("maps", "says"), [
    ("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.560.35.03\n", "libcuda"),
    ("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libcudart.so.12\n7f02-7f03 r-xp 0 08:01 2 /usr/lib/libc.so.6\n", None),
    (None, None),
])
def test_cuda_loaded_reads_the_process_maps(tmp_path, maps: str | None, says: str | None) -> None:
    """libcuda mapped means CUDA started; the runtime (libcudart) alone does not; no maps file: unknown."""
    from tfgpu_magic.tf.runtime import cuda_loaded

    path = tmp_path / "maps"
    if maps is not None:
        path.write_text(maps)
    assert cuda_loaded(str(path), driver=lambda: True) == says


def test_cuda_loaded_skips_the_maps_without_a_driver_and_remembers_libcuda(tmp_path, monkeypatch) -> None:
    """No NVIDIA driver: CUDA cannot start, the maps are not read. Once libcuda was seen in this
    process's own maps, it is not read again (the driver library is never unloaded)."""
    from tfgpu_magic.tf import runtime

    path = tmp_path / "maps"
    path.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.1\n")
    assert runtime.cuda_loaded(str(path), driver=lambda: False) is None
    assert runtime.cuda_loaded(str(path), driver=lambda: True) == runtime.LIBCUDA_LOADED
    assert runtime._libcuda_seen is False  # another file than the process's own maps: nothing remembered

    def no_driver_question() -> bool:
        raise AssertionError("asked again after libcuda was seen")

    monkeypatch.setattr(runtime, "_libcuda_seen", True)
    assert runtime.cuda_loaded(driver=no_driver_question) == runtime.LIBCUDA_LOADED


@pytest.mark.parametrize(("lines", "note"), [
    (("growth on", "limit 1GB 0"), "TF refuses set_memory_growth on a limited GPU"),
    (("growth on", "split cpu 2"), "any logical device makes TF drop it"),
    (("growth on",), None),
    (("limit 1GB", "split cpu 2"), None),
    (("allocator async", "growth on", "limit 1GB"), None),
])
def test_growth_note_is_short_and_only_where_it_matters(lines: tuple[str, ...], note: str | None) -> None:
    """The environment route for growth is explained in one short note, with the reason that fits
    (a capped GPU, or only a CPU split), never under cuda_malloc_async (growth is moot there), and a
    second apply of the same policy does not repeat it."""
    fake, ctl = session(1)
    report = edit(ctl, *lines)
    growth_notes = [n for n in map(note_text, report.notes) if GROWTH_ENV in n]
    assert growth_notes == ([] if note is None else [next(n for n in growth_notes if note in n)])
    assert all(len(n) <= 100 for n in growth_notes)
    assert not any(GROWTH_ENV in n for n in map(note_text, ctl.apply().notes))


ROUTE_IN_IPYTHON = """
import sys
sys.path.insert(0, sys.argv[1])
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
setup = '''
from fake_tf import FakeTF
from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog
from tfgpu_magic.views.tfstate import state_text
fake = FakeTF(1)
ctl = Controller(api=fake, environ={}, catalog=InventoryCatalog(Inventory()))
ctl.apply()
'''
for cell in [setup, "x = 1", "fake.device_lib.list_local_devices()", "label = state_text(ctl.state())"]:
    assert shell.run_cell(cell, store_history=True).success
print("LABEL " + shell.user_ns["label"])
"""


def test_route_names_the_ipython_cell_it_ran_in() -> None:
    """GPU-only, decided by the fake, in a real IPython shell (fresh process): the state names the
    cell by its In [N], read at call time (no per-cell hook)."""
    import subprocess
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", ROUTE_IN_IPYTHON, str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=120)
    [label] = [line for line in done.stdout.splitlines() if line.startswith("LABEL ")]
    assert label == ("LABEL GPU devices created by `device_lib.list_local_devices()` in In [3]: memory settings are "
                     "fixed until restart"), done.stderr


def test_split_policy_survives_device_lib_then_first_op() -> None:
    """GPU-only, decided by the fake: with `split 0 2x1GB` in force, device_lib creates the same three
    logical GPUs the eager context later asks for, so initialization keeps one id mapping (no
    "mapped to multiple devices") and runs with the split."""
    fake, ctl = routed(2, "split 0 2x1GB")
    gpus = [d.name for d in fake.device_lib.list_local_devices() if d.device_type == "GPU"]
    assert gpus == ["/device:GPU:0", "/device:GPU:1", "/device:GPU:2"]
    assert gpus_in_force(fake.initialize()) == [(0, False, (1024, 1024)), (1, False, None)]


def test_a_failing_policy_never_breaks_the_users_device_lib_call(capsys: pytest.CaptureFixture) -> None:
    """If building the policy's config fails, device_lib still runs (TF's default) and one line says so."""
    from tfgpu_magic.tf.routes import install_routes

    fake = FakeTF(1)

    def broken() -> None:
        raise RuntimeError("injected failure")

    install_routes(fake, broken)
    assert [d.device_type for d in fake.device_lib.list_local_devices()] == ["CPU", "GPU"]
    assert capsys.readouterr().err == ("tfgpu_magic: device_lib.list_local_devices(): the policy was not passed on: "
                                       "injected failure\n")
