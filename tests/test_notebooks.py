"""notebooks/from_the_tutorials.ipynb runs top to bottom in a real kernel (nbclient, real TF CPU) and shows,
for each technique of the two tutorials in shared/seeds, the directive and an export that does the same.

Nothing is faked: on the CI machine (no GPU, no driver) the GPU directives are recorded and exported only,
and the doctor and `limit 40%` meet the real absence of NVML; those checks are conditioned on `NO_DRIVER`.
"""

from __future__ import annotations

import importlib.util
import time

import nbformat
import pytest
from kernels import tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)
from notebook_runs import ALLOWED_TO_FAIL, NO_DRIVER, assert_quiet, execute, saved_without_outputs, shown_by

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]

NOTEBOOK = "from_the_tutorials.ipynb"
BUDGET_S = 60


@pytest.fixture(scope="module")
def run() -> tuple[nbformat.NotebookNode, float]:
    """The notebook executed once in an isolated kernel, and how long that took."""
    start = time.monotonic()
    nb = execute(NOTEBOOK)
    return nb, time.monotonic() - start


@pytest.fixture(scope="module")
def executed(run: tuple[nbformat.NotebookNode, float]) -> nbformat.NotebookNode:
    """The executed notebook alone."""
    return run[0]


def test_runs_quietly_and_quickly(run):
    """No error or stderr outside the one cell tagged to fail, and within the CI budget."""
    nb, seconds = run
    assert_quiet(nb)
    assert seconds < BUDGET_S, f"{seconds:.0f} s"


def test_saved_without_outputs():
    """The repository keeps the notebook clean; the test executes a copy in memory."""
    assert saved_without_outputs(NOTEBOOK)


def test_tutorial_code_is_shown_not_run(executed):
    """Each GPU recipe of the tutorials appears verbatim in markdown, and no code cell runs it."""
    markdown = "\n".join(cell.source for cell in executed.cells if cell.cell_type == "markdown")
    code = "\n".join(cell.source for cell in executed.cells if cell.cell_type == "code")
    for recipe in (
        "tf.config.experimental.set_visible_devices(devices=gpus[0:2], device_type='GPU')",
        "os.environ['CUDA_VISIBLE_DEVICES'] = \"2,3\"",
        "tf.config.experimental.set_memory_growth(device=gpu, True)",
        "config.gpu_options.allow_growth = True",
        "tf.config.experimental.VirtualDeviceConfiguration(memory_limit=1024)",
        "config.gpu_options.per_process_gpu_memory_fraction = 0.4",
        "tf.config.experimental.VirtualDeviceConfiguration(memory_limit=2048),",
        "tf.config.experimental.set_memory_growth(gpus[0], True)",
    ):
        assert recipe in markdown, recipe
        assert recipe not in code, recipe
    assert "no GPU" in markdown and "nbclient" in markdown


EXPORTS = {
    "visible": ("os.environ['CUDA_VISIBLE_DEVICES'] = '2,3'", "os.environ['CUDA_DEVICE_ORDER'] = 'PCI_BUS_ID'"),
    "growth": ("tf.config.experimental.set_memory_growth(gpu, True)",),
    "limit": ("memory_limits = {0: [1024]}", "tf.config.LogicalDeviceConfiguration(memory_limit=mib)"),
    "split": ("memory_limits = {0: [2048, 2048]}", "tf.config.LogicalDeviceConfiguration(memory_limit=mib)"),
    "template-export": ("os.environ['CUDA_VISIBLE_DEVICES'] = '0'", "set_memory_growth(gpu, True)"),
}
"""Per cell, lines its `%tfgpu export python` must print: the tutorial's calls, in the export's words."""


@pytest.mark.parametrize("cell_id", EXPORTS)
def test_each_directive_exports_the_tutorials_code(executed, cell_id):
    """The export next to each recipe contains the calls the recipe makes, and only that technique's
    (the `%tfgpu reset` between techniques worked: no growth outside the growth cells)."""
    shown = shown_by(executed, cell_id)
    for line in EXPORTS[cell_id]:
        assert line in shown, line
    assert ("set_memory_growth" in shown) == (cell_id in ("growth", "template-export"))


def test_fraction_needs_nvml_and_is_refused_in_one_line(executed):
    """Only `visible 2,3` (needs four GPUs where NVML checks) and `limit 40%` may fail; without a driver
    the latter is refused in one line naming why."""
    tagged = [cell.id for cell in executed.cells if ALLOWED_TO_FAIL in cell.get("metadata", {}).get("tags", [])]
    assert tagged == ["visible", "fraction"]
    if NO_DRIVER:
        shown = shown_by(executed, "fraction")
        assert "UsageError" in shown and "NVML unavailable" in shown
        assert len(shown.strip().splitlines()) == 1


def test_growth_with_limit_goes_through_the_environment(executed):
    """Growth and a limit together: status and export both use TF_FORCE_GPU_ALLOW_GROWTH and keep the cap."""
    status = shown_by(executed, "growth-limit")
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in status and "limit 6GB on GPU 0" in status
    assert "TF refuses set_memory_growth on a limited GPU" in status
    export = shown_by(executed, "growth-limit-export")
    assert "os.environ['TF_FORCE_GPU_ALLOW_GROWTH'] = 'true'" in export
    assert "memory_limits = {0: [6144]}" in export


def test_doctor_explains_a_container_without_gpus(executed):
    """[B]'s Docker pitfall: the doctor names the driver check and, with no driver, the `--gpus all` fix."""
    shown = shown_by(executed, "doctor")
    assert "NVIDIA driver" in shown
    if NO_DRIVER:
        assert "no NVIDIA driver here" in shown and "--gpus all" in shown


def test_cpu_split_really_applies(executed):
    """The one thing that applies without a GPU: two logical CPUs, seen by the tutorial's device count."""
    shown = shown_by(executed, "cpu-run")
    assert "logical CPUs: 2" in shown and "Number of devices: 2" in shown
    if NO_DRIVER:
        assert shown.startswith("[] [PhysicalDevice(name='/physical_device:CPU:0'")
    assert 'key: "CPU"\n  value: 2' in shown_by(executed, "session-config")


def test_rerun_after_initialization_locks_and_restart_says_what_to_do_under_nbclient(executed):
    """[B]'s Jupyter pitfall: TensorFlow's own RuntimeError by hand; through `%tfgpu`, growth on after
    initialization names the setting that is locked (no RuntimeError), and `%tfgpu restart`, which cannot
    restart an nbclient kernel, says how instead."""
    assert "RuntimeError: Virtual devices cannot be modified after being initialized" in shown_by(executed, "rerun-raw")
    growth = shown_by(executed, "rerun-growth")  # the CPU build: no GPU, so no restart to advise (no GPU allocator reads it)
    assert "`growth on` has nothing to apply to here" in growth and "TensorFlow sees no GPU" in growth
    assert "restart" not in growth.lower() and "RuntimeError" not in growth
    locked = shown_by(executed, "rerun-locked")
    assert "logical CPU devices: 2 logical devices → 4 logical devices" in locked and "%tfgpu restart" in locked
    restart = shown_by(executed, "restart")
    assert "4 logical devices" in restart
    assert "Nothing here can restart this kernel" in restart and "restart_kernel()" in restart


def test_going_back_to_what_is_in_force_leaves_nothing_pending(executed):
    """After the locked changes, the cell form back to the initial layout waits for no restart (it unsets the
    growth variable, which nothing in this GPU-less process reads, and JAX's, where `import tensorflow`
    imported JAX without starting its backends) and the status pends nothing."""
    jax = "; unset XLA_PYTHON_CLIENT_PREALLOCATE" if importlib.util.find_spec("jax") is not None else ""
    assert shown_by(executed, "revert").strip() == f"Applied: unset TF_FORCE_GPU_ALLOW_GROWTH{jax}"
    status = shown_by(executed, "revert-status")
    assert "CPU:0: 2 logical devices" in status and "Pending" not in status
