"""PyTorch in the kernel: the policy through the controller on `FakeTorch` (PyTorch's rules, tests/fake_torch.py)
beside FakeTF and tests/fake_nvml.py's four cards, for each directive at each moment (the policy before
`import torch`, after it, after its CUDA started); then real torch in fresh processes wherever it is
installed (this process never imports it), and the fake's rules against real torch where a CPU build shows them.

What counts is what PyTorch would run with once its CUDA starts (the fake's fractions, allocator and GPUs),
that the code under test never starts CUDA itself (the fake's trap), and what the status and reports say.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fake_nvml import UUIDS, FakeNvml, four_gpus
from fake_tf import FakeTF, SeamMisuse
from fake_torch import (ALLOC_CONF_ORDER, ASYNC, NATIVE, OWN_QUEUED, CudaStartedByCode, DeferredCudaCallError,
                        FakeOutOfMemoryError, FakeTorch, torch_visible)
from tfgpu_magic import importhooks
from tfgpu_magic.controller import Controller
from tfgpu_magic.frameworks import torch as torch_room
from tfgpu_magic.frameworks.torch import FractionSet
from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, driver_present, read_inventory
from tfgpu_magic.tf import quietimport
from tfgpu_magic.tf.apply import ApplyReport
from tfgpu_magic.views import status

INVENTORY = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
"""Three 80 GB cards and a 40 GB one (GPU 3), nvidia-smi order; this process on none of them."""
TOTALS = [gpu.memory_total_mib for gpu in INVENTORY.gpus]
MOMENTS = ("before import", "imported", "cuda started")
"""Where PyTorch is when the %tfgpu cell runs."""
BEFORE_CUDA = MOMENTS[:2]
CONF_VARIABLES = ALLOC_CONF_ORDER
ASYNC_CONF = "backend:cudaMallocAsync"
SOFT = " (a soft cap: its caching allocator stops there; CUDA's own context is extra)"
NO_TORCH = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                              reason="PyTorch is not installed in this Python (.ci/run installs torch 2.13.0's CPU "
                                     "wheel where it lies on this machine's disk)")


@pytest.fixture(autouse=True)
def clean_process(monkeypatch: pytest.MonkeyPatch):
    """PyTorch counts as installed (the fake stands for it), every import hook the controller arms goes
    afterwards, and this process never imports torch (the real tests run it in children)."""
    monkeypatch.setattr(torch_room, "installed", lambda: True)
    had_torch = "torch" in sys.modules
    yield
    quietimport.disarm()
    for name in ("torch", "jax"):
        importhooks.disarm(name)
    assert had_torch or "torch" not in sys.modules, "a test imported torch in the test process"


# ----- helpers ----------------------------------------------------------------------------------------
@dataclass
class Session:
    """One kernel process: its environment, TensorFlow (not imported), PyTorch and the controller."""

    env: dict
    tf: FakeTF
    torch: FakeTorch
    ctl: Controller


def session(moment: str, env: dict | None = None, cuda_build: bool = True) -> Session:
    """A process with the four cards where PyTorch is at `moment`; CUDA's driver is shared with FakeTF."""
    env = {} if env is None else env
    tf = FakeTF(len(UUIDS), imported=False, environ=env)
    tf.uuids = UUIDS  # one machine: CUDA enumerates the cards NVML lists
    torch = FakeTorch(environ=env, tf=tf, totals_mib=TOTALS, imported=moment != "before import", cuda_build=cuda_build)
    if moment == "cuda started":
        torch.start_cuda()
    return Session(env, tf, torch, Controller(api=tf, environ=env, catalog=InventoryCatalog(INVENTORY), torch=torch))


def import_torch(s: Session) -> None:
    """`import torch` with the controller's hook armed, as `importhooks.ImportHook` runs it: torch loads
    inside the hook's `around` (which sets its variables first), then the hook's callback runs."""
    hooks = [f for f in sys.meta_path if importhooks.is_hook(f) and f.target == "torch"]
    importhooks.disarm("torch")
    with contextlib.ExitStack() as stack:
        for hook in hooks:
            stack.enter_context(hook.around())
        s.torch.import_torch()
    for hook in hooks:
        hook.callback()


def run_cell(s: Session, *lines: str) -> list[ApplyReport]:
    """A %tfgpu cell, then `import torch` where it was not imported: the reports of both."""
    reports = [s.ctl.edit([s.ctl.parse(line) for line in lines])]
    if not s.torch.imported:
        import_torch(s)
        reports.append(s.ctl.last_report)
    return reports


def fraction_records(reports: list[ApplyReport]) -> list[FractionSet]:
    return [item for report in reports for item in report.applied if isinstance(item, FractionSet)]


def ours(s: Session) -> list:
    """What the code under test queued in torch (after torch's own calls)."""
    return s.torch.queued[len(OWN_QUEUED):]


def torch_row(ctl: Controller) -> str | None:
    """The PyTorch line of `%tfgpu` (None: the status has none)."""
    return dict(status.framework_rows(ctl.other_frameworks(), ctl.policy.growth is True)).get("PyTorch")


def locked(report: ApplyReport) -> dict[str, tuple]:
    """Variable name → (current, desired, why) of what the report names as too late."""
    return {change.device: (change.current, change.desired, change.why) for change in report.locked
            if change.setting == "variable"}


# ----- the fake's own rules (torch/cuda/__init__.py, torch/cuda/memory.py, c10/cuda) -------------------------
def test_fake_runs_the_queue_in_order_once_with_reentry() -> None:
    """`_lazy_init` runs every queued call in order, one queued meanwhile too; inside them CUDA is
    starting (`is_initialized()` False, `_lazy_init` returns at once, a fraction may be set); after,
    `_lazy_call` runs a call at once."""
    fake = FakeTorch(imported=True)
    seen = []

    def first() -> None:
        seen.append(("first", fake.is_initialized()))
        fake.start_cuda()  # re-entry: returns at once
        fake.set_fraction(0.5, 1)
        fake.when_cuda_starts(lambda: seen.append(("queued meanwhile", fake.is_initialized())))

    fake.when_cuda_starts(first)
    fake.when_cuda_starts(lambda: seen.append(("second", fake.is_initialized())))
    assert seen == [] and not fake.is_initialized()
    fake.start_cuda()
    assert seen == [("first", False), ("second", False), ("queued meanwhile", False)]
    assert fake.is_initialized() and fake.fractions == {1: 0.5} and fake.current == 0
    fake.start_cuda()
    fake.when_cuda_starts(lambda: seen.append(("after", fake.is_initialized())))
    assert seen[3:] == [("after", True)]


@pytest.mark.parametrize("call", ["set_fraction", "fraction"])
def test_fake_traps_a_call_that_would_start_cuda(call: str) -> None:
    """`set_per_process_memory_fraction` and its getter run `_lazy_init` first (torch/cuda/memory.py):
    before CUDA started, the code under test would start it. The trap comes before any argument check."""
    fake = FakeTorch(imported=True)
    with pytest.raises(CudaStartedByCode, match="real torch would start CUDA here"):
        fake.set_fraction(1, 0) if call == "set_fraction" else fake.fraction(0)
    assert fake.started_by is not None and not fake.is_initialized() and fake.fractions == {}


@pytest.mark.parametrize("fraction, device, error, text", [
    (1, 0, TypeError, "Invalid type for fraction argument, must be `float`"),
    (1.5, 0, ValueError, "Invalid fraction value: 1.5. Allowed range: 0~1"),
    (-0.1, 0, ValueError, "Invalid fraction value: -0.1. Allowed range: 0~1"),
    (0.5, 4, RuntimeError, "CUDA error: invalid device ordinal"),
    (0.5, -1, RuntimeError, "Invalid device argument -1: did you call init?"),
])
def test_fake_checks_fraction_and_device(fraction, device: int, error: type, text: str) -> None:
    """After CUDA started: the type and range checks of torch/cuda/memory.py, the device guard's and
    the allocator's device checks; nothing is set and the current device stays."""
    fake = FakeTorch(imported=True)
    fake.start_cuda()
    with pytest.raises(error, match=re.escape(text)):
        fake.set_fraction(fraction, device)
    assert fake.fractions == {} and fake.current == 0


def test_fake_device_count_follows_the_environment_until_cuda_starts() -> None:
    """Before CUDA starts `device_count()` reads CUDA_VISIBLE_DEVICES each time (NVML, not cached);
    once started it is what CUDA enumerated, whatever the variable says later."""
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    fake = FakeTorch(imported=True, environ=env)
    assert fake.device_count() == 1
    env["CUDA_VISIBLE_DEVICES"] = "0,2,3"
    assert fake.device_count() == 3
    fake.start_cuda()
    env["CUDA_VISIBLE_DEVICES"] = "0"
    assert fake.device_count() == 3 and fake.state().cuda_started


def test_fake_device_count_without_nvml_starts_the_driver() -> None:
    """Without NVML, `device_count()` asks the CUDA runtime (cudaGetDeviceCount starts the driver):
    the GPUs are fixed from that call on, though torch's CUDA has not started."""
    env = {"CUDA_VISIBLE_DEVICES": "1,2"}
    tf = FakeTF(4, imported=False, environ=env)
    fake = FakeTorch(imported=True, environ=env, tf=tf, nvml=False)
    assert fake.device_count() == 2 and tf.cuda_ids == [1, 2] and not fake.is_initialized()
    env["CUDA_VISIBLE_DEVICES"] = "0"
    assert fake.device_count() == 2


@pytest.mark.parametrize("value, count", [
    (None, 4), ("", 0), ("1", 1), ("3,1", 2), ("1gpu,2", 2), ("0,-1,2", 1), ("0,0", 0), ("2,7,1", 1),
    (UUIDS[2][:8], 1), (f"{UUIDS[3]},{UUIDS[0][:10]}", 2), ("GPU-", 0), (f"{UUIDS[1]},0", 1),
])
def test_fake_counts_visible_devices_as_torch_does(value: str | None, count: int) -> None:
    """`_parse_visible_devices` and `_device_count_nvml` on the four cards (real torch agrees:
    `test_visible_parsing_matches_real_torch`)."""
    assert torch_visible(value, len(UUIDS), UUIDS) == count


@pytest.mark.parametrize("env, read", [
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": ASYNC_CONF},
     "expandable_segments:True"),
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "expandable_segments:True"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}, ""),
    ({}, None),
])
def test_fake_reads_the_allocator_configuration_as_cuda_starts(env: dict, read: str | None) -> None:
    """CUDAAllocatorConfig::instance: the old name wins where set ('' counts); read once, at start."""
    fake = FakeTorch(imported=True, environ=env)
    fake.start_cuda()
    env["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:40"
    assert fake.alloc_conf == read and fake.loaded_backend == NATIVE


def test_fake_backend_is_picked_at_import() -> None:
    """`BackendStaticInitializer` picks the backend as the library loads; a different backend read at
    CUDA start is an internal assert (CUDAAllocatorConfig.cpp, pytorch#104801), and CUDA stays unstarted."""
    env = {"PYTORCH_ALLOC_CONF": ASYNC_CONF}
    early = FakeTorch(imported=True, environ=env)
    early.start_cuda()
    assert early.loaded_backend == ASYNC and early.alloc_conf == ASYNC_CONF
    env = {}
    late = FakeTorch(imported=True, environ=env)
    env["PYTORCH_CUDA_ALLOC_CONF"] = ASYNC_CONF
    with pytest.raises(RuntimeError, match="Allocator backend parsed at runtime != allocator backend parsed at load "
                                           "time, cudaMallocAsync != native"):
        late.start_cuda()
    assert not late.is_initialized()


def test_fake_failed_queued_call_leaves_cuda_unstarted_and_runs_again() -> None:
    """A queued call that raises: `DeferredCudaCallError` at the user's CUDA call, CUDA not started,
    and the whole queue runs again at the next call."""
    fake = FakeTorch(imported=True)
    runs = []

    def flaky() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise ValueError("boom")

    fake.when_cuda_starts(flaky)
    with pytest.raises(DeferredCudaCallError, match="CUDA call failed lazily at initialization with error: boom"):
        fake.start_cuda()
    assert not fake.is_initialized() and not fake.initializing
    fake.start_cuda()
    assert runs == [0, 1] and fake.is_initialized()


def test_fake_memory_and_the_soft_cap() -> None:
    """`memory_allocated` answers 0 before CUDA starts without starting it; an allocation past the
    fraction of the card's total is refused, one within it is not."""
    fake = FakeTorch(imported=True, totals_mib=TOTALS)
    assert fake.memory(0) == (0, 0) and not fake.is_initialized()
    fake.start_cuda()
    fake.set_fraction(0.05, 3)
    fake.allocate(3, 2048)
    with pytest.raises(FakeOutOfMemoryError):
        fake.allocate(3, 1)
    assert fake.memory(3) == (2048 * 2**20, 2048 * 2**20)


def test_fake_cpu_build() -> None:
    """A CPU build: no device, CUDA never starts ("Torch not compiled with CUDA enabled"), no CUDA version."""
    fake = FakeTorch(imported=True, cuda_build=False)
    assert fake.device_count() == 0 and fake.state().cuda_build is None
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
        fake.start_cuda()


def test_fake_before_import_is_misuse() -> None:
    fake = FakeTorch()
    assert fake.state() == torch_room.TorchState()
    with pytest.raises(SeamMisuse):
        fake.when_cuda_starts(lambda: None)


# ----- limits: per-device fractions, queued until CUDA starts --------------------------------------------------
@dataclass(frozen=True)
class Limit:
    """A cell's limit: MiB per card (None: a share), PyTorch's fraction per device once its CUDA started
    (a device not named keeps the whole card), and the `told:` part of the PyTorch line."""

    mib: int | None
    fractions: dict[int, float]
    row: str
    after_start: dict[int, float] | None = None
    """The fractions where the cell came after CUDA started, if they differ."""
    row_after_start: str | None = None


EVERY_CARD_2GB = {0: 0.025, 1: 0.025, 2: 0.025, 3: 0.05}
LIMITS = {
    "limit 2GB": Limit(2048, EVERY_CARD_2GB,
                       "memory fractions GPU 0: 0.025, GPU 1: 0.025, GPU 2: 0.025, GPU 3: 0.05" + SOFT),
    "limit 2GB 1": Limit(2048, {1: 0.025}, "memory fraction 0.025 on GPU 1" + SOFT),
    "limit 50%": Limit(None, dict.fromkeys(range(4), 0.5), "memory fraction 0.5 on GPU 0, 1, 2, 3" + SOFT),
    "visible 0,2 | limit 4GB": Limit(
        4096, {0: 0.05, 1: 0.05}, "memory fraction 0.05 on GPU 0, 1" + SOFT,
        # CUDA_VISIBLE_DEVICES comes too late once CUDA started: PyTorch keeps all four cards, each limited
        {0: 0.05, 1: 0.05, 2: 0.05, 3: 0.1}, "memory fractions GPU 0: 0.05, GPU 1: 0.05, GPU 2: 0.05, GPU 3: 0.1" + SOFT),
}
"""Cells (`|` between lines) that limit PyTorch. GPU 3 has 40 GB: 2 GB is 0.05 of it."""
LIFE = {"before import": "not imported; ", "imported": "2.13.0+cu128, imported, CUDA not started; ",
        "cuda started": "2.13.0+cu128, CUDA started: its allocator settings are fixed until restart; "}
"""The start of the PyTorch line at each moment (views/status.py `_framework_line`)."""


def told(moment: str, what: str) -> str:
    """The PyTorch line at `moment` when the policy tells it `what`."""
    return LIFE[moment] + ("at its import: " if moment == "before import" else "told: ") + what


def wanted(cell: str, moment: str) -> dict[int, float]:
    limit = LIMITS[cell]
    return limit.after_start if moment == "cuda started" and limit.after_start else limit.fractions


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("cell", LIMITS)
def test_limit_gives_each_device_its_fraction(cell: str, moment: str) -> None:
    """Before CUDA starts one call is queued (the report says so, per device) and nothing starts
    CUDA; the user's first CUDA call sets the fractions. Once started they are set at once."""
    s = session(moment)
    reports = run_cell(s, *cell.split(" | "))
    fractions = wanted(cell, moment)
    assert s.torch.started_by is None
    if moment in BEFORE_CUDA:
        assert ours(s) == [s.ctl.fractions._at_cuda_start] and not s.torch.is_initialized()
        assert fraction_records(reports) == [FractionSet(device, f, queued=True) for device, f in fractions.items()]
        assert s.torch.fractions == {}
        s.torch.start_cuda()  # the user's first CUDA call
    else:
        assert fraction_records(reports) == [FractionSet(device, f) for device, f in fractions.items()]
    assert s.torch.fractions == fractions and s.torch.current == 0
    assert s.torch.started_by is None


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("cell", LIMITS)
def test_a_fraction_never_allows_more_than_the_limit(cell: str, moment: str) -> None:
    """On each limited card, PyTorch can take the limit and not a MiB more (fractions round down)."""
    s = session(moment)
    run_cell(s, *cell.split(" | "))
    s.torch.start_cuda()
    cards = s.tf.cuda_ids
    for device, fraction in wanted(cell, moment).items():
        total = TOTALS[cards[device]]
        allowed = int(fraction * total)
        assert allowed <= (LIMITS[cell].mib or total // 2)
        s.torch.allocate(device, allowed)
        with pytest.raises(FakeOutOfMemoryError):
            s.torch.allocate(device, 1)


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("cell", [pytest.param(cell)
                                  for cell in LIMITS])
def test_limit_status_line(cell: str, moment: str) -> None:
    """The PyTorch line: where PyTorch is in its life, then the fractions and that they are a soft cap."""
    s = session(moment)
    s.ctl.edit([s.ctl.parse(line) for line in cell.split(" | ")])
    limit = LIMITS[cell]
    row = limit.row_after_start if moment == "cuda started" and limit.row_after_start else limit.row
    assert torch_row(s.ctl) == told(moment, row)
    assert s.torch.started_by is None


def test_limit_off_after_cuda_started_gives_back_the_whole_device() -> None:
    s = session("cuda started")
    run_cell(s, "limit 2GB")
    calls = len(s.torch.calls)
    report = s.ctl.edit([s.ctl.parse("limit off")])
    assert fraction_records([report]) == [FractionSet(device, 1.0) for device in range(4)]
    assert s.torch.fractions == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    assert [call[0] for call in s.torch.calls[calls:]].count("set_fraction") == 4
    assert torch_row(s.ctl) == LIFE["cuda started"] + "told nothing"


def test_limit_off_before_cuda_starts_sets_nothing() -> None:
    s = session("imported")
    run_cell(s, "limit 2GB")
    run_cell(s, "limit off")
    assert ours(s) == [s.ctl.fractions._at_cuda_start]
    s.torch.start_cuda()
    assert s.torch.fractions == {} and s.torch.started_by is None


def test_the_queued_call_reads_the_policy_as_cuda_starts() -> None:
    """Edits before CUDA starts queue nothing more; the call reads the fractions (and CUDA's GPUs)
    the policy asks for as CUDA starts: `visible` given after the limit counts."""
    s = session("imported")
    run_cell(s, "limit 2GB")
    run_cell(s, "visible 0,3")
    assert ours(s) == [s.ctl.fractions._at_cuda_start]
    s.torch.start_cuda()
    assert s.tf.cuda_ids == [0, 3] and s.torch.fractions == {0: 0.025, 1: 0.05}


def test_a_changed_limit_after_cuda_started_sets_only_what_changed() -> None:
    s = session("cuda started")
    run_cell(s, "limit 2GB")
    calls = len(s.torch.calls)
    report = s.ctl.edit([s.ctl.parse("limit 4GB 3")])
    assert fraction_records([report]) == [FractionSet(3, 0.1)]
    assert [call for call in s.torch.calls[calls:] if call[0] == "set_fraction"] == [("set_fraction", 0.1, 3)]


# ----- the allocator: PyTorch's allocator configuration -----------------------------------------------------------
def test_allocator_async_after_cuda_started_is_reported_locked() -> None:
    """Once PyTorch is imported (its CUDA started too), both variables are reported as too late (read as
    it was imported) and left alone."""
    s = session("cuda started")
    [report] = run_cell(s, "allocator async")
    assert locked(report) == {name: (None, ASYNC_CONF, "torch_import") for name in CONF_VARIABLES}
    assert not any(name in s.env for name in CONF_VARIABLES)
    assert torch_row(s.ctl) == LIFE["cuda started"] + "told nothing"


def test_allocator_async_before_import_is_told_at_import() -> None:
    """Before `import torch` the status says what its import will bring: both variables."""
    s = session("before import")
    s.ctl.edit([s.ctl.parse("allocator async")])
    assert torch_row(s.ctl) == told("before import", ", ".join(f"{name}={ASYNC_CONF}" for name in CONF_VARIABLES))


def test_allocator_async_before_import_reaches_the_allocator() -> None:
    """A policy given before `import torch` is in the environment as torch's CUDA library loads (its
    backend is picked then), so the user's first CUDA call runs on cudaMallocAsync."""
    s = session("before import")
    run_cell(s, "allocator async")
    assert s.torch.loaded_backend == ASYNC
    s.torch.start_cuda()
    assert s.torch.alloc_conf == ASYNC_CONF


def test_allocator_async_after_import_is_reported_locked_and_cuda_still_starts() -> None:
    """After `import torch` the backend can no longer change: both variables are reported as too
    late, left alone, and the user's first CUDA call still works."""
    s = session("imported")
    [report] = run_cell(s, "allocator async")
    assert set(locked(report)) == set(CONF_VARIABLES)
    assert not any(name in s.env for name in CONF_VARIABLES)
    s.torch.start_cuda()


def test_an_inherited_configuration_keeps_its_keys() -> None:
    """`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` from the user: `allocator async` adds the
    backend to it in both variables (set as `import torch` begins); `allocator bfc` takes the backend
    away and keeps the key."""
    s = session("before import", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    run_cell(s, "allocator async")
    merged = "expandable_segments:True,backend:cudaMallocAsync"
    assert {name: s.env.get(name) for name in CONF_VARIABLES} == dict.fromkeys(CONF_VARIABLES, merged)
    after_start = session("cuda started", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    [report] = run_cell(after_start, "allocator async")
    assert {name: desired for name, (_, desired, _) in locked(report).items()} == dict.fromkeys(CONF_VARIABLES, merged)
    bfc = session("before import", env={"PYTORCH_CUDA_ALLOC_CONF": f"{ASYNC_CONF},expandable_segments:True"})
    run_cell(bfc, "allocator bfc")
    assert {name: bfc.env.get(name) for name in CONF_VARIABLES} == dict.fromkeys(CONF_VARIABLES, "expandable_segments:True")


def test_the_keys_merged_are_those_torch_reads() -> None:
    """Both variables inherited with different keys: torch reads PYTORCH_CUDA_ALLOC_CONF's (the old
    name wins, `test_which_allocator_variable_wins_in_real_torch`), so those are the keys kept."""
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": "max_split_size_mb:40"}
    s = session("cuda started", env=env)
    [report] = run_cell(s, "allocator async")
    assert {name: desired for name, (_, desired, _) in locked(report).items()} == dict.fromkeys(
        CONF_VARIABLES, "expandable_segments:True,backend:cudaMallocAsync")


# ----- growth and visible ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("moment", MOMENTS)
def test_growth_has_nothing_to_do_for_pytorch(moment: str) -> None:
    """PyTorch's caching allocator never preallocates: nothing is set, and the status says so."""
    s = session(moment)
    s.ctl.edit([s.ctl.parse("growth on")])
    if moment == "before import":
        assert not importhooks.is_armed("torch")  # the policy tells PyTorch nothing: no hook
        s.torch.import_torch()
    assert torch_row(s.ctl) == told("imported" if moment == "before import" else moment,
                                    "growth: nothing to do (its caching allocator never preallocates)")
    s.torch.start_cuda()
    assert s.torch.fractions == {} and s.torch.alloc_conf is None and not any(n in s.env for n in CONF_VARIABLES)
    assert s.torch.started_by is None


@pytest.mark.parametrize("moment", BEFORE_CUDA)
def test_visible_before_cuda_starts_decides_pytorchs_gpus(moment: str) -> None:
    s = session(moment)
    run_cell(s, "visible 0,2")
    assert s.env["CUDA_VISIBLE_DEVICES"] == "0,2" and s.torch.device_count() == 2
    s.torch.start_cuda()
    assert s.tf.cuda_ids == [0, 2] and s.torch.device_count() == 2 and s.torch.started_by is None


def test_visible_after_pytorchs_cuda_started_is_reported_locked() -> None:
    s = session("cuda started")
    [report] = run_cell(s, "visible 0,2")
    assert "CUDA_VISIBLE_DEVICES" in locked(report) and s.torch.device_count() == 4


# ----- the code under test never starts PyTorch's CUDA ----------------------------------------------------------
CELLS = ["limit 2GB", "limit 2GB 1", "limit 50%", "limit 2GB | limit off", "allocator async", "allocator bfc",
         "growth on", "visible 0,2", "visible 1 | limit 1GB", "split 0 1GB,1GB", "reset"]


@pytest.mark.parametrize("moment", BEFORE_CUDA)
@pytest.mark.parametrize("cell", CELLS)
def test_nothing_starts_cuda_but_the_user(cell: str, moment: str) -> None:
    """Editing, the status, the memory figures and the panel's frameworks leave PyTorch's CUDA unstarted."""
    s = session(moment)
    run_cell(s, *cell.split(" | "))
    status.describe_status(s.ctl)
    assert s.ctl.framework_memory() == {}
    s.ctl.other_frameworks()
    assert not s.torch.is_initialized() and s.torch.started_by is None
    assert s.tf.cuda_ids is None  # nor CUDA's driver


@pytest.mark.parametrize("cell, cards", [("limit 2GB", {0, 1, 2, 3}), ("limit 2GB 1", {1}), ("growth on", set())])
def test_each_limited_card_gets_a_context_as_cuda_starts(cell: str, cards: set[int]) -> None:
    """Setting a fraction selects its device (the allocator's setMemoryFraction), which makes a CUDA
    context there as CUDA starts, used or not; the device a plain `device="cuda"` takes stays GPU 0."""
    s = session("imported")
    run_cell(s, cell)
    s.torch.start_cuda()
    assert s.torch.contexts == cards and s.torch.current == 0


def test_a_cpu_build_is_said_and_never_started() -> None:
    s = session("imported", cuda_build=False)
    run_cell(s, "limit 2GB")
    assert torch_row(s.ctl) == ("2.13.0+cpu, imported, CUDA not started (a CPU-only build); told: "
                                + LIMITS["limit 2GB"].row)
    assert s.torch.started_by is None and not s.torch.is_initialized()


# ----- real PyTorch, in fresh processes ---------------------------------------------------------------------------
CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
mode, lines = sys.argv[2], sys.argv[3:]
if mode.endswith("nvml"):
    from fake_nvml import FakeNvml, four_gpus
    from tfgpu_magic.gpus import inventory
    nvml = inventory.Nvml(module=FakeNvml(four_gpus(this_kernel=False)))
    inventory.shared_nvml = lambda: nvml
if mode.startswith("torch-first"):
    import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "tfgpu_magic")
refused = []
for line in lines:
    try:
        shell.run_line_magic("tfgpu", line)
    except UsageError as err:
        refused.append(str(err))
names = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
before = {name: os.environ.get(name) for name in names}
shell.run_cell("import torch", store_history=False)
import torch
from tfgpu_magic.controller import get_controller
from tfgpu_magic.views import status
ctl = get_controller()
print(json.dumps({
    "queued": [call == ctl.fractions._at_cuda_start for call, _ in torch.cuda._queued_calls],
    "initialized": torch.cuda.is_initialized(), "version": torch.__version__, "cuda": torch.version.cuda,
    "before": before,
    "after": {name: os.environ.get(name) for name in names}, "refused": refused,
    "row": dict(status.framework_rows(ctl.other_frameworks(), False)).get("PyTorch"),
    "locked": [status.item_text(item) for item in ctl.last_report.locked],
    "status": status.describe_status(ctl)}))
"""


def run_child(tmp_path: Path, source: str, *args: str, env: dict | None = None) -> dict:
    """Run `source` in a fresh Python (this one's), IPython's files in `tmp_path`; its last line, as JSON."""
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith(("PYTORCH_", "CUDA_VISIBLE"))}
    environ.update(IPYTHONDIR=str(tmp_path / "ipython"), **(env or {}))
    done = subprocess.run([sys.executable, "-c", source, *args], capture_output=True, text=True, timeout=120,
                          env=environ, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


TESTS = str(Path(__file__).resolve().parent)


@NO_TORCH
@pytest.mark.parametrize("mode", ["policy-first-nvml", "torch-first-nvml"])
def test_real_torch_queues_the_fractions_and_leaves_cuda_alone(tmp_path: Path, mode: str) -> None:
    """`%load_ext tfgpu_magic` on a real IPython shell (NVML: the fake four cards), `limit 2GB` and
    `allocator async`, with `import torch` after the policy or before it: our one call waits last in
    torch's own queue, CUDA is not started, the allocator variables are in the environment, and the
    PyTorch line says a CPU build and the fractions."""
    found = run_child(tmp_path, CHILD, TESTS, mode, "limit 2GB", "allocator async")
    assert found["queued"][-1] is True and found["queued"].count(True) == 1
    assert not found["initialized"] and found["refused"] == []
    build = " (a CPU-only build)" if found["cuda"] is None else ""
    if mode.startswith("policy-first"):  # set as `import torch` began: its allocator backend is picked then
        assert found["before"] == dict.fromkeys(CONF_VARIABLES) and found["after"] == dict.fromkeys(CONF_VARIABLES, ASYNC_CONF)
        variables = ", ".join(f"{name}={ASYNC_CONF}" for name in CONF_VARIABLES)
        assert found["row"] == (f"{found['version']}, imported, CUDA not started{build}; told: {variables}; "
                                + LIMITS["limit 2GB"].row)
    else:  # torch was imported before the policy: too late for the backend, said so, left alone
        assert found["after"] == dict.fromkeys(CONF_VARIABLES)
        assert f"PYTORCH_CUDA_ALLOC_CONF: unset → {ASYNC_CONF} (read when PyTorch was imported)" in found["locked"]
        assert found["row"] == f"{found['version']}, imported, CUDA not started{build}; told: " + LIMITS["limit 2GB"].row


@NO_TORCH
@pytest.mark.skipif(driver_present(), reason="an NVIDIA driver is here: NVML knows the cards' totals")
def test_real_torch_without_nvml_takes_no_size(tmp_path: Path) -> None:
    """Without NVML (this machine) a size cannot become a share: the status says PyTorch is not
    limited; `limit 50%` is one clear line; torch's queue still holds our one call, CUDA unstarted."""
    found = run_child(tmp_path, CHILD, TESTS, "policy-first", "limit 2GB", "limit 50%")
    assert found["refused"] == ["a size in % needs the card's total memory, which is unknown: "
                                + found["refused"][0].split("unknown: ", 1)[1]] and len(found["refused"]) == 1
    assert "JAX and PyTorch take a limit as a share of each card's total memory, which is unknown here" in found["status"]
    build = " (a CPU-only build)" if found["cuda"] is None else ""
    assert found["row"] == f"{found['version']}, imported, CUDA not started{build}; told nothing"
    assert found["queued"][-1] is True and not found["initialized"]


PARITY = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
from fake_torch import FakeTorch, OWN_QUEUED, torch_visible
from fake_tf import SeamMisuse
found = {"own": [call.__name__ for call, _ in torch.cuda._queued_calls], "fake_own": list(OWN_QUEUED)}
ran = []
torch.cuda._lazy_call(lambda: ran.append(1))
found["lazy_call"] = [len(torch.cuda._queued_calls), ran, torch.cuda.is_initialized()]
fake = FakeTorch(imported=True, cuda_build=False)
fake.when_cuda_starts(lambda: ran.append(1))
found["fake_lazy_call"] = [len(fake.queued), ran, fake.is_initialized()]
def outcome(call):
    try:
        return ["ok", call()]
    except SeamMisuse as err:
        return ["starts CUDA", type(err).__name__]
    except AssertionError as err:
        return ["starts CUDA", str(err)]
    except Exception as err:
        return [type(err).__name__, str(err)]
cuda = torch.cuda
found["real"] = [outcome(lambda: cuda.set_per_process_memory_fraction(1, 0)),
                 outcome(lambda: cuda.get_per_process_memory_fraction(0)),
                 outcome(lambda: [cuda.memory_allocated(0), cuda.memory_reserved(0)]),
                 outcome(cuda.device_count), outcome(cuda.is_initialized)]
found["fake"] = [outcome(lambda: fake.set_fraction(1, 0)), outcome(lambda: fake.fraction(0)),
                 outcome(lambda: list(fake.memory(0))), outcome(fake.device_count), outcome(fake.is_initialized)]
uuids = ["GPU-0a6f8c2e-1d3b", "GPU-b1c2d3e4-f5a6", "GPU-b2d4f6a8-0c1e", "GPU-c3e5a7b9-2d4f"]
def nvml_count(value):
    if value is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = value
    visible = cuda._parse_visible_devices()
    if not visible:
        return 0
    if isinstance(visible[0], str):
        return len(cuda._transform_uuid_to_ordinals(visible, uuids))
    return next((i for i, index in enumerate(visible) if index >= len(uuids)), len(visible))
values = [None, "", "1", "3,1", "1gpu,2", "0,-1,2", "0,0", "2,7,1", "GPU-b2", "GPU-c3e5a7b9,GPU-0a", "GPU-",
          "GPU-b1c2,0", "GPU-b,GPU-0a", "GPU-0a,GPU-0a6f", " 2, 1"]
found["visible"] = [[nvml_count(value), torch_visible(value, len(uuids), uuids)] for value in values]
found["settings"] = torch._C._accelerator_getAllocatorSettings()
print(json.dumps(found))
"""


@NO_TORCH
def test_fake_matches_real_torch_where_a_cpu_build_shows_it(tmp_path: Path) -> None:
    """torch's own queued calls; `_lazy_call` before CUDA starts queues and runs nothing; the fraction's
    setter and getter start CUDA before any check (a CPU build then refuses: the fake's trap stands for
    that start); the figures answer 0 without starting; `_parse_visible_devices` counts as the fake does."""
    found = run_child(tmp_path, PARITY, TESTS)
    assert found["own"] == found["fake_own"]
    assert found["lazy_call"] == [len(OWN_QUEUED) + 1, [], False]
    assert found["fake_lazy_call"] == found["lazy_call"]
    assert found["real"][0] == found["real"][1] == ["starts CUDA", "Torch not compiled with CUDA enabled"]
    assert found["fake"][0] == found["fake"][1] == ["starts CUDA", "CudaStartedByCode"]
    assert found["real"][2:] == found["fake"][2:] == [["ok", [0, 0]], ["ok", 0], ["ok", False]]
    assert all(real == fake for real, fake in found["visible"]), found["visible"]


@NO_TORCH
@pytest.mark.parametrize("env", [
    {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:40", "PYTORCH_ALLOC_CONF": "expandable_segments:True"},
    {"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
    {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "expandable_segments:True"},
], ids=["both", "new-only", "old-empty"])
def test_which_allocator_variable_wins_in_real_torch(tmp_path: Path, env: dict) -> None:
    """torch's allocator settings as it read them (`_accelerator_getAllocatorSettings`) are the value
    the fake reads at CUDA start: the old name wins where it is set, even empty."""
    found = run_child(tmp_path, PARITY, TESTS, env=env)
    fake = FakeTorch(imported=True, environ=dict(env))
    fake.start_cuda()
    assert found["settings"] == fake.alloc_conf
