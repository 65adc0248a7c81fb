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
from tfgpu_magic import importhook, status
from tfgpu_magic.controller import Controller
from tfgpu_magic.inventory import Gpu, Inventory, InventoryCatalog
from tfgpu_magic.plan import OUR_ENV, Plan
from tfgpu_magic.runtime import ApplyReport, apply_plan

GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"
STARTS = ("before import", "imported", "devices listed")
"""Where TensorFlow is when the %tfgpu cell runs."""


@pytest.fixture(autouse=True)
def clean_process():
    """Disarm the real import hook the controller arms; the fake path must never import TensorFlow."""
    had_tf = "tensorflow" in sys.modules
    yield
    importhook.disarm()
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


def import_tensorflow(fake: FakeTF) -> None:
    """`import tensorflow` with the controller's hook armed: TF loads, then the hook's callback runs."""
    hook = next(f for f in sys.meta_path if isinstance(f, importhook.TensorFlowImportHook))
    importhook.disarm()
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
    "inherited CUDA_VISIBLE_DEVICES": Case(
        4, ("limit 1GB 3",), [(2, False, None), (3, False, (1024,))], env={"CUDA_VISIBLE_DEVICES": "2,3"}
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
    assert any(GROWTH_ENV in note for report in reports for note in report.notes)
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
    assert any("set_visible_devices" in note for report in reports for note in report.notes) == bool(set_visible_calls)


def test_policy_before_import_waits_for_the_import_hook() -> None:
    """Before import only the environment changes; the hook applies the rest right after import."""
    fake, ctl = session(2, "before import")
    report = edit(ctl, "growth on", "limit 1GB 1")
    assert report.waiting and importhook.is_armed()
    assert fake.calls == [] and ctl.environ[GROWTH_ENV] == "true"
    assert "when TensorFlow is imported" in status.describe_report(report)
    assert "not imported" in status.describe_status(ctl)
    import_tensorflow(fake)
    assert not importhook.is_armed()
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
    "add a limit": ((), ("limit 2GB 0",), ["logical devices of GPU:0: TF default → 2048 MiB"]),
    "growth + limit": (("growth on",), ("limit 2GB 0",), [f"{GROWTH_ENV}: unset → true", "logical devices of GPU:0"]),
    "hide a GPU": ((), ("visible 0",), ["visible GPUs: GPU:0, GPU:1 → GPU:0"]),
    "other split": (("split 1 2x1GB",), ("split 1 3x1GB",), ["logical devices of GPU:1: 1024 MiB + 1024 MiB →"]),
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
    assert all(want in item for want, item in zip(locked, report.locked)), report.locked
    assert (fake.snapshot(), len(fake.calls), ctl.environ) == (before, calls, env)
    text = status.describe_report(report)
    assert status.RESTART_HINT in text and all(item in text for item in report.locked)
    state_text = status.describe_status(ctl)
    assert fake.state().label in state_text
    assert all(item in state_text for item in report.locked if not item.startswith(OUR_ENV))


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
    plan = Plan(visible_gpus=(0, 2), gpu_configs=((0, (None, None)), (2, (512,))), cpu_devices=2)
    report = apply_plan(plan, fake)
    assert len(report.failed) == 1 and report.locked == []
    assert report.failed[0].startswith("logical devices of GPU:0")
    assert report.failed[0].endswith("TensorFlow said: Setting memory limit is required for GPU virtual devices")
    applied = [item.split(":")[0] for item in report.applied]
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
    assert "GPU:2: memory growth TF default, logical GPUs 1024 MiB + 1024 MiB" in text


# ----- regressions: bugs once found through the fake --------------------------------------------
def test_limit_off_after_it_was_recorded_is_not_claimed_in_force() -> None:
    """TF cannot drop a logical config: `limit off` is reported as needing a restart, not as done."""
    fake, ctl = session(2)
    edit(ctl, "limit 2GB 0")
    report = edit(ctl, "limit off")
    assert not report.ok and report.applied == []
    assert [item.split(":")[0] for item in report.locked] == ["logical devices of GPU"]
    assert "GPU:0: 2048 MiB → TF default" in report.locked[0]
    pending = status.describe_status(ctl).split("Pending, needs a restart:\n", 1)
    assert len(pending) == 2 and report.locked[0] in pending[1]
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
    assert any("sees no GPU" in note for note in report.notes)
