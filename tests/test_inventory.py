"""The NVML inventory and everything built on it, with NVML faked at its one chokepoint (`Nvml.call`):
reading GPUs, unknown fields, the catalog the grammar resolves GPUs with, percentages, `visible auto`,
UUID-to-index mapping in the plan, the controller end to end and the status lines. TensorFlow is
never imported in this process."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fake_nvml
import tfgpu_magic
from fake_nvml import MIG_UUIDS, OTHER_PID, UUIDS, FakeGpu, FakeNvml, OlderBinding, four_gpus
from tfgpu_magic.tf import quietimport
from tfgpu_magic import doctor
from tfgpu_magic.gpus import inventory as inventory_module
from tfgpu_magic.controller import Controller
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.language.grammar import Edit, parse_gpu, parse_line
from tfgpu_magic.gpus.inventory import GpuProcess, Inventory, InventoryCatalog, MigDevice, Nvml, read_inventory
from tfgpu_magic.plan import build_plan, tf_index
from tfgpu_magic.language.policy import Policy
from tfgpu_magic.views.status import describe_gpus, describe_policy, describe_status, item_text
from tfgpu_magic.views.status import note_text
from tfgpu_magic.views.tfstate import state_text

pynvml = importlib.import_module("pynvml") if importlib.util.find_spec("pynvml") else None
needs_pynvml = pytest.mark.skipif(pynvml is None, reason="compares the fake with nvidia-ml-py, which is not installed")
"""Only the tests that compare the fake with the real binding need it; the rest run on the fake alone."""

ME = os.getpid()
UNAVAILABLE = Inventory(error="NVML could not start: Driver Not Loaded")


def read(fake: FakeNvml) -> Inventory:
    """The inventory read through the chokepoint from `fake`."""
    return read_inventory(Nvml(module=fake))


@pytest.fixture
def inventory() -> Inventory:
    """The standard four-GPU machine of tests/fake_nvml.py."""
    return read(FakeNvml(four_gpus()))


@pytest.fixture
def catalog(inventory: Inventory) -> InventoryCatalog:
    """The grammar's view of the standard machine."""
    return InventoryCatalog(inventory)


def apply(line: str, catalog: InventoryCatalog | None, policy: Policy = Policy()) -> Policy:
    """The policy one directive line makes of `policy`."""
    directive = parse_line(line, catalog)
    assert isinstance(directive, Edit), line
    return directive.change(policy, catalog)


# ----- the fake mirrors pynvml ------------------------------------------------------------------
FAKE_FUNCTIONS = sorted(name for name in vars(FakeNvml) if name.startswith("nvml"))


@needs_pynvml
@pytest.mark.parametrize("name", FAKE_FUNCTIONS)
def test_fake_functions_exist_in_pynvml(name: str) -> None:
    """Every function the fake offers is a real pynvml function of that name."""
    assert callable(getattr(pynvml, name, None))


NVML_NAME = re.compile(r"nvml[A-Z]\w*")


def nvml_names(package: Path) -> tuple[set[str], set[str]]:
    """The NVML functions the package's source names: (as attributes or imported names, as strings
    handed to `Nvml.call`), by an AST walk of every module, so a new call is found without a list."""
    attributes, strings = set(), set()
    for module in package.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and NVML_NAME.fullmatch(node.attr):
                attributes.add(node.attr)
            elif isinstance(node, ast.alias) and NVML_NAME.fullmatch(node.name):
                attributes.add(node.name)
            elif isinstance(node, ast.Name) and NVML_NAME.fullmatch(node.id):
                attributes.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and NVML_NAME.fullmatch(node.value):
                strings.add(node.value)
    return attributes, strings


DIRECT, THROUGH_CALL = nvml_names(Path(tfgpu_magic.__file__).parent)
CALLED = sorted(DIRECT | THROUGH_CALL)


def test_the_walk_finds_the_calls() -> None:
    """The walk sees both kinds: `nvmlInit` called on the module, the doctor's capability read by name."""
    assert "nvmlInit" in DIRECT and {"nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetCount"} <= THROUGH_CALL


@pytest.mark.parametrize("name", CALLED)
def test_every_nvml_function_the_package_calls_is_in_the_fake(name: str) -> None:
    """The fake answers every NVML function the package names, so the fake-GPU kernel
    (tests/fake_gpu_kernel.py) runs each path the package has."""
    assert callable(getattr(FakeNvml, name, None))


@needs_pynvml
@pytest.mark.parametrize("name", CALLED)
def test_every_nvml_function_the_package_calls_is_in_pynvml(name: str) -> None:
    """... and so does the installed nvidia-ml-py."""
    assert callable(getattr(pynvml, name, None))


def everything_read(nvml: Nvml) -> tuple[Inventory, dict[int, tuple[int, int]]]:
    """All the package reads from NVML: the inventory and the doctor's compute capabilities."""
    inventory = read_inventory(nvml)
    return inventory, doctor.read_compute_capabilities(inventory, nvml)


@pytest.mark.parametrize("name", sorted(THROUGH_CALL))
def test_a_function_the_binding_lacks_means_unknown(name: str) -> None:
    """An nvidia-ml-py older than a function (the module has no such attribute) reads exactly as a driver
    that says Not Supported to it: that field unknown, everything else read, no AttributeError."""
    older = everything_read(Nvml(module=OlderBinding(FakeNvml(four_gpus()), {name})))
    refused = everything_read(Nvml(module=FakeNvml(four_gpus(), fail={name: fake_nvml.NVML_ERROR_NOT_SUPPORTED})))
    assert older == refused and older != everything_read(Nvml(module=FakeNvml(four_gpus())))


@needs_pynvml
@pytest.mark.parametrize(
    "call, struct",
    [
        (lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h), "c_nvmlMemory_t"),
        (lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h), "c_nvmlUtilization_t"),
        (lambda nvml, h: nvml.nvmlDeviceGetPciInfo(h), "nvmlPciInfo_t"),
        (lambda nvml, h: nvml.nvmlDeviceGetComputeRunningProcesses(h)[0], "c_nvmlProcessInfo_t"),
    ],
    ids=["memory", "utilization", "pci", "process"],
)
def test_fake_results_have_pynvml_fields(call, struct: str) -> None:
    """The fake's result objects carry only fields the real ctypes structs have."""
    nvml = FakeNvml(four_gpus())
    nvml.nvmlInit()
    result = call(nvml, nvml.nvmlDeviceGetHandleByIndex(0))
    assert set(vars(result)) <= {name for name, _ in getattr(pynvml, struct)._fields_}


@needs_pynvml
@pytest.mark.parametrize("code", sorted(fake_nvml._ERROR_TEXT))
def test_fake_errors_match_pynvml(code: int) -> None:
    """Error codes and texts are pynvml's."""
    names = [n for n in dir(fake_nvml) if n.startswith("NVML_ERROR_") and getattr(fake_nvml, n) == code]
    assert names and all(getattr(pynvml, n) == code for n in names)
    assert str(fake_nvml.NVMLError(code)) == str(pynvml.NVMLError(code))


def test_fake_refuses_calls_before_init() -> None:
    """Like NVML, the fake answers nothing before nvmlInit."""
    with pytest.raises(fake_nvml.NVMLError, match="Uninitialized"):
        FakeNvml(four_gpus()).nvmlDeviceGetCount()


BLOCK_PYNVML = """
import sys
sys.modules["pynvml"] = None  # as in an environment without nvidia-ml-py
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-x", sys.argv[1], "-k", "fake_refuses or missing_binding"]))
"""


def test_runs_without_nvidia_ml_py() -> None:
    """Where nvidia-ml-py is missing this module still collects: the fake-NVML tests run, only the
    comparisons with the real binding skip."""
    done = subprocess.run([sys.executable, "-c", BLOCK_PYNVML, __file__], capture_output=True, text=True,
                          cwd=Path(__file__).parent, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout


# ----- reading the inventory --------------------------------------------------------------------
@pytest.mark.parametrize(
    "index, name, bus, total, used, free, busy",
    [
        (0, "NVIDIA A100-SXM4-80GB", "00000000:07:00.0", 81920, 20480, 61439, 50),
        (1, "NVIDIA A100-SXM4-80GB", "00000000:0F:00.0", 81920, 1024, 80896, 30),
        (2, "NVIDIA A100-SXM4-80GB", "00000000:47:00.0", 81920, 1024, 80896, 10),
        (3, "NVIDIA A100-SXM4-40GB", "00000000:4E:00.0", 40960, 0, 40960, None),
    ],
)
@pytest.mark.parametrize("text_as_bytes", [False, True], ids=["str", "bytes"])
def test_reads_every_gpu(index, name, bus, total, used, free, busy, text_as_bytes) -> None:
    """Fields per GPU; bytes → whole MiB (rounded down); str or bytes text; MIG GPU: no utilization."""
    inventory = read(FakeNvml(four_gpus(), text_as_bytes=text_as_bytes))
    gpu = inventory.gpus[index]
    assert inventory.available and inventory.driver_version == "550.54.15"
    assert (gpu.index, gpu.uuid, gpu.name, gpu.pci_bus_id) == (index, UUIDS[index], name, bus)
    assert (gpu.memory_total_mib, gpu.memory_used_mib, gpu.memory_free_mib, gpu.utilization_pct) == (
        total, used, free, busy)


def test_processes_mark_this_kernel(inventory: Inventory) -> None:
    """Compute processes with MiB used; the one with this process's pid is `is_self`."""
    assert inventory.gpus[0].processes == (GpuProcess(ME, 1024, True), GpuProcess(OTHER_PID, 19456, False))
    assert all(gpu.processes == () for gpu in inventory.gpus[1:])


def test_in_a_pid_namespace_of_its_own_no_process_is_this_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's pids are the host's: in a container's pid namespace a host process may carry this
    process's pid, so `is_self` is unknown and so is what this process holds (tests/test_pid_namespace.py
    runs it in a real namespace); a card with no process still holds 0 of ours."""
    from tfgpu_magic.gpus import processes

    monkeypatch.setattr(processes, "foreign_pid_namespace", lambda: True)
    found = read(FakeNvml(four_gpus()))
    assert found.gpus[0].processes == (GpuProcess(ME, 1024, None), GpuProcess(OTHER_PID, 19456, None))
    assert inventory_module.self_mib(found.gpus[0]) is None and inventory_module.self_mib(found.gpus[1]) == 0
    monkeypatch.setattr(processes, "foreign_pid_namespace", lambda: None)  # /proc/self/ns unreadable: as before
    assert read(FakeNvml(four_gpus())).gpus[0].processes[0].is_self is True


def test_visible_auto_never_picks_from_a_stale_reading(inventory: Inventory) -> None:
    stale = inventory._replace(stale_seconds=30.0, blocked_seconds=28.0,
                               warning=inventory_module.not_answering(28.0, 30.0))
    said = "`visible auto` needs current GPU figures: the NVIDIA driver is not answering: an NVML call has waited 28 s"
    with pytest.raises(PolicyError, match=re.escape(f"{said}; these GPU figures are from 30 s ago")):
        apply("visible auto", InventoryCatalog(stale))
    assert apply("visible 1", InventoryCatalog(stale)).visible == ("1",)  # naming a card needs no current figure


def test_process_memory_unknown() -> None:
    """NVML's 'not available' process memory (None) stays unknown."""
    inventory = read(FakeNvml([FakeGpu(UUIDS[0], processes=[(OTHER_PID, None)])]))
    assert inventory.gpus[0].processes == (GpuProcess(OTHER_PID, None, False),)


def test_mig_devices_listed(inventory: Inventory) -> None:
    """Only the MIG-enabled GPU lists instances (empty slots skipped); find() reaches them by UUID."""
    assert inventory.gpus[3].mig_devices == (MigDevice(MIG_UUIDS[0], 19968), MigDevice(MIG_UUIDS[1], 9856))
    assert [gpu.mig_devices for gpu in inventory.gpus[:3]] == [(), (), ()]
    assert [d.uuid for d in inventory.devices()] == [*UUIDS, *MIG_UUIDS]
    assert inventory.find(MIG_UUIDS[1][:8]) == MigDevice(MIG_UUIDS[1], 9856)


def test_minor_numbers_are_read_per_card() -> None:
    """N of each card's /dev/nvidiaN (what Slurm's gres IDs name), not its nvidia-smi index."""
    gpus = four_gpus()
    gpus[0].minor, gpus[2].minor = 2, 0
    assert [gpu.minor for gpu in read(FakeNvml(gpus)).gpus] == [2, 1, 0, 3]


def test_mig_capable_but_disabled_lists_none() -> None:
    """A MIG-capable card with MIG off (mode [0, 0]) has no instances even if slots are configured."""
    gpu = FakeGpu(UUIDS[0], mig=[fake_nvml.FakeMig(MIG_UUIDS[0], 9856)], mig_enabled=False)
    assert read(FakeNvml([gpu])).gpus[0].mig_devices == ()


UNKNOWN_FIELDS = [
    ("nvmlDeviceGetUtilizationRates", lambda inv: {g.utilization_pct for g in inv.gpus}, {None}),
    ("nvmlDeviceGetMemoryInfo",
     lambda inv: {(g.memory_total_mib, g.memory_used_mib, g.memory_free_mib) for g in inv.gpus}, {(None,) * 3}),
    ("nvmlDeviceGetPciInfo", lambda inv: {g.pci_bus_id for g in inv.gpus}, {None}),
    ("nvmlDeviceGetName", lambda inv: {g.name for g in inv.gpus}, {None}),
    ("nvmlDeviceGetUUID", lambda inv: [g.uuid for g in inv.gpus] + [inv.gpus[3].mig_devices],
     ["unknown-0", "unknown-1", "unknown-2", "unknown-3", ()]),
    ("nvmlDeviceGetComputeRunningProcesses", lambda inv: {g.processes for g in inv.gpus}, {()}),
    ("nvmlDeviceGetMigMode", lambda inv: {g.mig_devices for g in inv.gpus}, {()}),
    ("nvmlDeviceGetMigDeviceHandleByIndex", lambda inv: inv.gpus[3].mig_devices, ()),
    ("nvmlSystemGetDriverVersion", lambda inv: inv.driver_version, None),
    ("nvmlDeviceGetMinorNumber", lambda inv: {g.minor for g in inv.gpus}, {None}),
]


@pytest.mark.parametrize("function, extract, expected", UNKNOWN_FIELDS, ids=[c[0] for c in UNKNOWN_FIELDS])
@pytest.mark.parametrize("code", [fake_nvml.NVML_ERROR_NOT_SUPPORTED, fake_nvml.NVML_ERROR_NO_PERMISSION,
                                  fake_nvml.NVML_ERROR_FUNCTION_NOT_FOUND])
def test_failing_call_means_unknown(function, extract, expected, code) -> None:
    """An NVML error in one call makes its fields unknown; the rest of the inventory is still read."""
    inventory = read(FakeNvml(four_gpus(), fail={function: code}))
    assert inventory.available and len(inventory.gpus) == 4
    assert extract(inventory) == expected
    if function != "nvmlDeviceGetUUID":
        assert [g.uuid for g in inventory.gpus] == list(UUIDS)


def test_failing_count_means_no_gpu() -> None:
    """If NVML cannot count the GPUs, the inventory is available but empty (not a crash)."""
    inventory = read(FakeNvml(four_gpus(), fail={"nvmlDeviceGetCount": fake_nvml.NVML_ERROR_UNINITIALIZED}))
    assert inventory.available and inventory.gpus == ()


def test_one_gpu_failing_keeps_the_others_and_their_numbers() -> None:
    """A lost GPU is left out; the others keep their nvidia-smi index; a per-GPU failure stays local."""
    gpus = four_gpus()
    gpus[1].fail["nvmlDeviceGetHandleByIndex"] = fake_nvml.NVML_ERROR_GPU_IS_LOST
    gpus[2].fail["nvmlDeviceGetUtilizationRates"] = fake_nvml.NVML_ERROR_NOT_SUPPORTED
    inventory = read(FakeNvml(gpus))
    assert [(g.index, g.uuid) for g in inventory.gpus] == [(0, UUIDS[0]), (2, UUIDS[2]), (3, UUIDS[3])]
    assert [g.utilization_pct for g in inventory.gpus] == [50, None, None]


@pytest.mark.parametrize(
    "init_error, says",
    [
        (fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVML could not start: Driver Not Loaded (no NVIDIA driver"),
        (fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML could not start: NVML Shared Library Not Found"),
        (OSError("libnvidia-ml.so.1: cannot open shared object file"), "NVML could not start: libnvidia-ml.so.1"),
    ],
    ids=["driver-not-loaded", "library-not-found", "oserror"],
)
def test_init_failure_sets_error(init_error, says: str) -> None:
    """nvmlInit failing: `Inventory.error` says why, no GPU, and nothing else is asked of NVML."""
    fake = FakeNvml(four_gpus(), init_error=init_error)
    inventory = read(fake)
    assert not inventory.available and says in inventory.error
    assert inventory.gpus == () and fake.calls == ["nvmlInit"]
    assert Nvml(module=fake).call("nvmlDeviceGetCount") is None


@needs_pynvml
@pytest.mark.skipif(any(Path("/dev").glob("nvidia[0-9]*")), reason="this machine has an NVIDIA GPU")
def test_real_nvml_is_missing_on_this_machine() -> None:
    """The real pynvml on this driverless machine: an error naming NVML and the driver, no exception."""
    inventory = read_inventory()
    assert not inventory.available and inventory.gpus == ()
    assert "NVML" in inventory.error and "driver" in inventory.error.lower()
    [line] = describe_gpus(inventory)
    assert line.startswith("GPUs:") and "no NVIDIA driver" in line


def test_missing_binding_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a driver but without nvidia-ml-py the inventory says how to install it."""
    monkeypatch.setattr(inventory_module, "driver_present", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert read_inventory(Nvml()).error == "nvidia-ml-py is not installed (`pip install nvidia-ml-py`)"


def test_no_driver_means_no_pynvml_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without any sign of an NVIDIA driver pynvml is not even imported; the error says why."""
    monkeypatch.setattr(inventory_module, "driver_present", lambda: False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # importing it would say 'not installed'
    error = read_inventory(Nvml()).error
    assert error.startswith("NVML unavailable: no NVIDIA driver here (none of /proc/driver/nvidia")


def test_cached_inventory_reuses_a_recent_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cached_inventory` reads NVML once per `max_age` seconds."""
    reads = []
    monkeypatch.setattr(inventory_module, "_cache", None)
    monkeypatch.setattr(inventory_module, "read_inventory", lambda: reads.append(1) or Inventory(error=str(len(reads))))
    first = inventory_module.cached_inventory()
    assert inventory_module.cached_inventory() is first and len(reads) == 1
    assert inventory_module.cached_inventory(max_age=-1).error == "2"


# ----- the catalog ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ref, resolved",
    [
        ("0", "0"),
        ("3", "3"),
        (UUIDS[1], UUIDS[1]),
        (UUIDS[2].upper(), UUIDS[2]),
        ("GPU-0", UUIDS[0]),
        ("GPU-b1", UUIDS[1]),
        ("GPU-B2D4", UUIDS[2]),
        ("MIG-5e", MIG_UUIDS[0]),
        (MIG_UUIDS[1], MIG_UUIDS[1]),
    ],
)
def test_catalog_resolves(catalog: InventoryCatalog, ref: str, resolved: str) -> None:
    """Indices stay indices; full UUIDs (any case) and unique prefixes become the full UUID."""
    assert catalog.resolve(ref) == resolved


@pytest.mark.parametrize("text, resolved", [("02", "2"), ("gpu-b2", UUIDS[2]), ("mig-7a8b", MIG_UUIDS[1])])
def test_parse_gpu_resolves_through_catalog(catalog: InventoryCatalog, text: str, resolved: str) -> None:
    """The grammar hands its normalized reference to the catalog."""
    assert parse_gpu(text, catalog) == resolved


@pytest.mark.parametrize(
    "ref, says",
    [
        ("7", "there is no GPU 7"),
        ("GPU-ff", "no GPU has a UUID starting with GPU-ff"),
        ("MIG-00", "no GPU has a UUID starting with MIG-00"),
    ],
)
def test_catalog_error_names_the_gpus(catalog: InventoryCatalog, ref: str, says: str) -> None:
    """A GPU that does not exist is a PolicyError that names the real GPUs."""
    with pytest.raises(PolicyError) as raised:
        catalog.resolve(ref)
    message = str(raised.value)
    assert says in message
    assert all(f"GPU {i} ({uuid[:12]})" in message for i, uuid in enumerate(UUIDS)), message


def test_ambiguous_prefix_is_an_error(catalog: InventoryCatalog) -> None:
    """A prefix shared by two GPUs is refused rather than guessed; the message lists the candidates' UUIDs."""
    with pytest.raises(PolicyError) as raised:
        catalog.resolve("GPU-b")
    message = str(raised.value)
    assert message == f"GPU-b matches 2 devices ({UUIDS[1]}, {UUIDS[2]}); give more of the UUID"


def test_catalog_without_inventory() -> None:
    """No NVML: references pass unchecked, MIG is told by its prefix, numbers are a PolicyError saying why."""
    catalog = InventoryCatalog(UNAVAILABLE)
    assert [catalog.resolve(ref) for ref in ("9", "GPU-b1")] == ["9", "GPU-b1"]
    assert (catalog.is_mig("mig-1"), catalog.is_mig("GPU-1"), catalog.uuid_to_index()) == (True, False, {})
    for needs_numbers in (lambda: catalog.total_mib("0"), catalog.refs, catalog.by_free_memory):
        with pytest.raises(PolicyError, match="Driver Not Loaded"):
            needs_numbers()


def test_catalog_facts(catalog: InventoryCatalog) -> None:
    """Indices in nvidia-smi order, UUID → index aliases (GPUs only), MIG detection, totals."""
    assert catalog.refs() == ["0", "1", "2", "3"]
    assert catalog.uuid_to_index() == {uuid: str(i) for i, uuid in enumerate(UUIDS)}
    assert [catalog.is_mig(ref) for ref in ("3", UUIDS[3], MIG_UUIDS[0])] == [False, False, True]
    assert [catalog.total_mib(ref) for ref in ("0", UUIDS[3], MIG_UUIDS[1])] == [81920, 40960, 9856]


# ----- visible auto -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, picked",
    [("visible auto", (2,)), ("visible auto:1", (2,)), ("visible auto:2", (2, 1)), ("visible AUTO:4", (2, 1, 0, 3))],
)
def test_visible_auto_picks_the_freest(catalog: InventoryCatalog, line: str, picked: tuple[int, ...]) -> None:
    """Most free memory first, a tie (GPUs 1 and 2) goes to the less busy card; pinned by UUID."""
    policy = apply(line, catalog)
    assert policy.visible == tuple(UUIDS[i] for i in picked)
    ((field, why),) = policy.sources
    assert field == "visible" and why.startswith("auto picked GPU 2 (79.0 GiB free, 10% busy)")
    assert [int(part.split()[0]) for part in why.split("GPU ")[1:]] == list(picked)


def test_visible_auto_unknown_utilization_ranks_last() -> None:
    """Equal free memory: a card whose utilization is unknown comes after any known one."""
    gpus = [FakeGpu(UUIDS[0], mig=[], mig_enabled=True), FakeGpu(UUIDS[1], utilization=99)]
    assert apply("visible auto", InventoryCatalog(read(FakeNvml(gpus)))).visible == (UUIDS[1],)


def test_visible_auto_explains_unknown_utilization(catalog: InventoryCatalog) -> None:
    """The reason for a pick never shows Python's None: an unknown utilization (GPU 3, in MIG mode) is left out."""
    why = apply("visible auto:4", catalog).sources[0][1]
    assert "None" not in why
    assert why.endswith(", GPU 0 (60.0 GiB free, 50% busy), GPU 3 (40.0 GiB free)")


@pytest.mark.parametrize(
    "line, catalog, says",
    [
        ("visible auto", None, "`visible auto` needs the GPU inventory"),
        ("visible auto:2", InventoryCatalog(UNAVAILABLE), "needs the GPU inventory, which is unavailable: NVML could"),
        ("visible auto:5", InventoryCatalog(read(FakeNvml(four_gpus()))), "this machine has only 4 GPU(s)"),
        ("visible auto:0", InventoryCatalog(read(FakeNvml(four_gpus()))), "COUNT must be 1 to 64"),
    ],
    ids=["no-catalog", "no-nvml", "too-many", "zero"],
)
def test_visible_auto_refused(line: str, catalog, says: str) -> None:
    """`visible auto` needs a working inventory with enough GPUs."""
    with pytest.raises(PolicyError) as raised:
        parse_line(line, catalog)
    assert says in str(raised.value)


# ----- percentages and MIG ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, limits, splits",
    [
        ("limit 50%", (("0", 40960), ("1", 40960), ("2", 40960), ("3", 20480)), ()),
        ("limit 25% 1", (("1", 20480),), ()),
        ("limit 10% 0,3", (("0", 8192), ("3", 4096)), ()),
        (f"limit 50% {MIG_UUIDS[0][:10]}", ((MIG_UUIDS[0], 9984),), ()),
        ("split 0 2x10%", (), (("0", (8192, 8192)),)),
        ("split 3 25%,1GB", (), (("3", (10240, 1024)),)),
    ],
)
def test_percent_of_each_card(catalog: InventoryCatalog, line: str, limits: tuple, splits: tuple) -> None:
    """NN% is taken of each card's own total (a MIG instance: its own memory)."""
    policy = apply(line, catalog)
    assert (policy.limits, policy.splits) == (limits, splits)


@pytest.mark.parametrize(
    "catalog, says",
    [
        (None, "50%: the card's total memory is unknown"),
        (InventoryCatalog(UNAVAILABLE), "a size in % needs the card's total memory, which is unknown: NVML could"),
        (InventoryCatalog(read(FakeNvml(four_gpus(), fail={"nvmlDeviceGetMemoryInfo": 3}))),
         "50%: the card's total memory of GPU 0 is unknown"),
    ],
    ids=["no-catalog", "no-nvml", "memory-unknown"],
)
def test_percent_needs_the_total(catalog, says: str) -> None:
    """Without a card's total a percentage is a PolicyError that says so."""
    with pytest.raises(PolicyError) as raised:
        apply("limit 50%", catalog)
    assert says in str(raised.value)


def test_percent_limit_respects_visible(catalog: InventoryCatalog) -> None:
    """`limit 50%` after `visible 0` caps the visible GPU, as `limit 4GB` would."""
    policy = apply("limit 50%", catalog, apply("visible 0", catalog))
    assert policy.limit_map == {"0": 40960}


def test_percent_limit_spares_split_gpus(catalog: InventoryCatalog) -> None:
    """`limit 50%` with GPU 1 split caps every other card, as `limit 4GB` on all GPUs would."""
    policy = apply("limit 50%", catalog, apply("split 1 2x1GB", catalog))
    assert policy.limit_map == {"0": 40960, "2": 40960, "3": 20480} and policy.split_map == {"1": (1024, 1024)}


@pytest.mark.parametrize("refs", [",".join(MIG_UUIDS), f"{MIG_UUIDS[0][:8]},{MIG_UUIDS[1][:8]}"])
def test_two_mig_instances_refused(catalog: InventoryCatalog, refs: str) -> None:
    """CUDA uses one MIG instance per process: asking for two is a PolicyError saying so."""
    with pytest.raises(PolicyError, match="2 MIG instances given, but CUDA uses only one MIG instance per process"):
        parse_line(f"visible {refs}", catalog)


def test_one_mig_instance_with_a_gpu_accepted(catalog: InventoryCatalog) -> None:
    """A single MIG instance is fine, resolved to its full UUID."""
    assert apply(f"visible {MIG_UUIDS[1][:8]},0", catalog).visible == (MIG_UUIDS[1], "0")


# ----- plan: UUIDs and indices ------------------------------------------------------------------
@pytest.mark.parametrize(
    "visible, ref, index",
    [
        (("0", "2"), UUIDS[2], 1),
        ((UUIDS[2], UUIDS[0]), "0", 1),
        ((UUIDS[3],), "3", 0),
        ((UUIDS[1], "3"), UUIDS[3], 1),
        (None, UUIDS[3], 3),
        (("0", "2"), UUIDS[1], None),
        ((MIG_UUIDS[0],), MIG_UUIDS[0], 0),
    ],
)
def test_uuid_and_index_map_to_one_tf_index(catalog, visible, ref: str, index: int | None) -> None:
    """A limit by UUID finds its TF index when `visible` lists indices, and vice versa (catalog aliases)."""
    aliases = catalog.uuid_to_index()
    assert tf_index(ref, None if visible is None else list(visible), aliases) == index
    plan = build_plan(Policy(visible=visible, limits=((ref, 1024),)), aliases=aliases)
    expected = ((), (ref,)) if index is None else (((ref, index),), ())
    assert (plan.tf_indices, plan.unresolved) == expected
    assert (plan.tf_limits, plan.tf_default_limits) == (() if index is None else ((index, (1024,)),), None)


def test_without_aliases_a_uuid_is_unresolved() -> None:
    """No inventory: a UUID limit over index-visible GPUs cannot be placed, and a note says why."""
    plan = build_plan(Policy(visible=("0", "2"), limits=((UUIDS[2], 1024),)))
    assert plan.unresolved == (UUIDS[2],) and "a UUID needs the GPU inventory" in note_text(plan.notes[-1])


# ----- the controller end to end ----------------------------------------------------------------
@pytest.fixture
def controller():  # noqa: ANN201
    """A controller over a private environment and the fake inventory (this kernel not on a GPU yet);
    TensorFlow is not imported."""
    ctl = Controller(environ={}, catalog=InventoryCatalog(read(FakeNvml(four_gpus(this_kernel=False)))))
    yield ctl
    quietimport.disarm()
    assert "tensorflow" not in sys.modules


def edit(ctl: Controller, line: str):  # noqa: ANN201
    return ctl.edit([ctl.parse(line)])


def test_controller_visible_auto_then_limits(controller: Controller) -> None:
    """`visible auto:2` pins UUIDs in CUDA_VISIBLE_DEVICES; limits by prefix or index land on TF's numbers."""
    report = edit(controller, "visible auto:2")
    assert report.waiting and quietimport.is_armed()
    assert controller.environ == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": f"{UUIDS[2]},{UUIDS[1]}"}
    edit(controller, "limit 25% gpu-b1")
    edit(controller, "limit 1GB 2")
    assert controller.policy.limits == (("2", 1024), (UUIDS[1], 20480))
    plan = controller.plan()
    assert (plan.tf_indices, plan.unresolved) == ((("2", 0), (UUIDS[1], 1)), ())
    assert (plan.tf_limits, plan.tf_default_limits) == (((0, (1024,)), (1, (20480,))), None)
    assert any(part.startswith("(visible: auto picked GPU 2") for part in describe_policy(controller.policy))
    assert f"       pid {OTHER_PID}: 19.0 GiB" in describe_status(controller).splitlines()


def test_this_process_on_a_gpu_means_cuda_variables_are_too_late(catalog: InventoryCatalog) -> None:
    """NVML lists this PID on GPU 0 (PyTorch, JAX or CuPy started CUDA): `visible 0,2` after TF is
    imported but before it listed devices cannot work through CUDA_VISIBLE_DEVICES any more: the
    GPUs are hidden through tf.config.set_visible_devices instead, and a note says so. (GPU-only:
    decided by the fake NVML and FakeTF; CUDA reads its variables once, at cuInit.)"""
    from fake_tf import FakeTF

    ctl = Controller(api=FakeTF(4), environ={}, catalog=catalog)
    ctl.policy = Policy(growth=True)  # any GPU setting: CUDA_DEVICE_ORDER would be wanted
    label = state_text(ctl.state())
    assert "CUDA_* changes no longer take effect" in label and "NVML lists this process on a GPU" in label
    report = edit(ctl, "visible 0,2")
    assert ctl.environ == {} and report.locked == []
    assert item_text(report.applied[0]) == "visible GPUs: GPU:0, GPU:1, GPU:2, GPU:3 → GPU:0, GPU:2"
    assert any("set_visible_devices" in note for note in map(note_text, report.notes))
    quietimport.disarm()


@pytest.mark.parametrize(
    "line, says",
    [("visible 9", "there is no GPU 9"), (f"visible {','.join(MIG_UUIDS)}", "one MIG instance per process"),
     ("limit 10% GPU-ff", "no GPU has a UUID starting with GPU-ff")],
)
def test_controller_refuses_and_changes_nothing(controller: Controller, line: str, says: str) -> None:
    """A bad line through the controller: PolicyError, policy and environment untouched."""
    edit(controller, "visible 0,2")
    before = (controller.policy, dict(controller.environ))
    with pytest.raises(PolicyError) as raised:
        edit(controller, line)
    assert says in str(raised.value)
    assert (controller.policy, controller.environ) == before


def test_controller_index_visible_uuid_limit(controller: Controller) -> None:
    """`visible 0,2` then `limit 2GB <uuid of 2>`: TF index 1, via the catalog's aliases."""
    edit(controller, "visible 0,2")
    edit(controller, f"limit 2GB {UUIDS[2][:8]}")
    assert controller.environ["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert (controller.plan().tf_limits, controller.plan().tf_default_limits) == (((1, (2048,)),), None)


# ----- status -----------------------------------------------------------------------------------
SHORT_UUIDS = ("GPU-0a6f8c2e…", "GPU-b1c2d3e4…", "GPU-b2d4f6a8…", "GPU-c3e5a7b9…")
"""UUIDS as the status shows them (one screen width with four GPUs)."""


def test_status_lists_live_memory(inventory: Inventory) -> None:
    """One line per GPU (memory, busy, short UUID, PCI bus), its MIG instances and its processes, this
    kernel marked."""
    lines = describe_gpus(inventory)
    assert lines[0] == "GPUs (NVML, driver 550.54.15, nvidia-smi numbering):"
    gpu_lines = [line for line in lines if line.startswith("  ") and not line.startswith("       ")]
    assert [line.split()[0] for line in gpu_lines] == ["0", "1", "2", "3"]
    for line, fragment, uuid in zip(gpu_lines, ["20.0 / 80 GiB used, 50% busy", "1.0 / 80 GiB used, 30% busy",
                                                "1.0 / 80 GiB used, 10% busy", "0.0 / 40 GiB used  "], SHORT_UUIDS):
        assert fragment in line and f"  {uuid}  bus 00000000:" in line
    assert f"       pid {ME}: 1.0 GiB (this kernel)" in lines
    assert f"       pid {OTHER_PID}: 19.0 GiB" in lines
    assert lines[-2:] == [f"       MIG {MIG_UUIDS[0]}  19.5 GiB", f"       MIG {MIG_UUIDS[1]}  9.6 GiB"]


def test_status_unknown_fields_show_question_marks() -> None:
    """Unknown memory reads '?', unknown utilization is left out."""
    gpus = [FakeGpu(UUIDS[0], processes=[(ME, None)])]
    fake = FakeNvml(gpus, fail={"nvmlDeviceGetMemoryInfo": 3, "nvmlDeviceGetUtilizationRates": 3})
    lines = describe_gpus(read(fake))
    assert lines[1].startswith(f"  0  NVIDIA A100-SXM4-80GB  ? / ? used  {SHORT_UUIDS[0]}  bus ")
    assert lines[2] == f"       pid {ME}: ? (this kernel)"


def test_status_without_gpus() -> None:
    """NVML working but listing no GPU says so."""
    [line] = describe_gpus(read(FakeNvml([])))
    assert line.startswith("GPUs:") and ("sees none" in line or "sees no GPU" in line)  # status.py's wording


def test_same_card_by_uuid_and_by_index_is_one_card(catalog: InventoryCatalog) -> None:
    """A split of GPU 0 and a limit on GPU 0's UUID contradict; a limit on GPU 0 while `visible`
    names only GPU 2 by UUID is a limit on a hidden card. Both are refused and change nothing."""
    ctl = Controller(environ={}, catalog=catalog)
    uuid0, uuid2 = (gpu.uuid for gpu in catalog.inventory.gpus if gpu.index in (0, 2))
    ctl.edit([ctl.parse("split 0 2x1GB")])
    before = ctl.policy
    with pytest.raises(PolicyError, match="both a limit and a split"):
        ctl.edit([ctl.parse(f"limit 3GB {uuid0}")])
    with pytest.raises(PolicyError, match="is not visible"):
        ctl.edit([ctl.parse(f"visible {uuid2}")])
    assert ctl.policy == before
