"""`%tfgpu` in real ipykernel kernels with real TensorFlow (CPU build); TF never enters pytest itself.

"split cpu N" proves a policy was applied before the first op: TensorFlow only accepts it then.
Kernels are shared by the checks of one scenario; a scenario that needs a fresh TensorFlow gets
its own kernel.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from kernels import HEAVY_MODULES, CellResult, Kernel, running_kernel, tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]

CPU_COUNT = "len(__import__('tensorflow').config.list_logical_devices('CPU'))"
POLICY = "__import__('tfgpu_magic').current_policy().to_dict()"
HOOK_ARMED = "__import__('tfgpu_magic.tf.quietimport').tf.quietimport.is_armed()"
ENV_PROBE = "{k: __import__('os').environ.get(k) for k in __import__('tfgpu_magic.envvars').envvars.NAMES}"

EMPTY_POLICY = {"visible": None, "growth": None, "limits": {}, "splits": {}, "cpu_devices": None, "allocator": None,
                "loglevel": None}
RECORDED = "Recorded; the rest applies when TensorFlow is imported."


def assert_no_traceback(result: CellResult) -> None:
    """Nothing in the cell's output looks like a crash."""
    for marker in ("Traceback", "RuntimeError", "cannot be modified after"):
        assert marker not in result.output, result.output
    assert not result.errors, result.output


def assert_usage_error(result: CellResult, message: str) -> None:
    """A one-line `UsageError` with `message`, no traceback frames from the package."""
    assert result.status == "error"
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("UsageError: ") and message in lines[0], result.output
    assert "tfgpu_magic/" not in result.output and "Traceback" not in result.output


# ----- policy recorded first, then one cell imports TensorFlow and runs the first op ---------------
FIRST_OP = {
    "tensorflow": "import tensorflow as tf\ntf.constant(1)\n",
    "keras": "import keras\nkeras.ops.ones(1)\nimport tensorflow as tf\n",
}


@pytest.fixture(scope="module", params=sorted(FIRST_OP))
def locked_kernel(request) -> Iterator[tuple[Kernel, dict[str, CellResult]]]:
    """`split cpu 3` recorded, then ONE cell imports (TF directly, or through keras) and runs an op."""
    with running_kernel() as kernel:
        steps = {"load": kernel.ok("%load_ext tfgpu_magic"), "record": kernel.ok("%tfgpu split cpu 3")}
        steps["first_op"] = kernel.ok(FIRST_OP[request.param] + "print('logical CPUs:', " + CPU_COUNT + ")")
        yield kernel, steps


def test_policy_applies_on_import_before_first_op(locked_kernel):
    """The hook applied the split between `import` and the first op, then removed itself."""
    kernel, steps = locked_kernel
    assert RECORDED in steps["record"].stdout
    assert steps["first_op"].stdout.strip() == "logical CPUs: 3"
    assert "tfgpu_magic" not in steps["first_op"].stderr
    assert kernel.evaluate(HOOK_ARMED) is False


def test_change_after_initialization_is_reported_not_raised(locked_kernel):
    """A different split after the first op names the locked setting and the restart, no traceback."""
    kernel, _ = locked_kernel
    result = kernel.run("%tfgpu split cpu 4")
    assert result.status == "ok"
    assert_no_traceback(result)
    assert "logical CPU devices: 3 logical devices → 4 logical devices" in result.stdout
    assert "cannot change now" in result.stdout and "restart" in result.stdout.lower()
    assert kernel.evaluate(CPU_COUNT) == 3


def test_identical_policy_after_initialization_is_already_in_force(locked_kernel):
    """Re-running the policy TensorFlow already has gives no warning and no pending change."""
    kernel, _ = locked_kernel
    result = kernel.ok("%tfgpu split cpu 3")
    assert result.stdout.strip() == "Already in force."
    assert result.stderr == ""
    status = kernel.ok("%tfgpu").output
    assert "CPU:0: 3 logical devices" in status and "Pending" not in status


@pytest.mark.parametrize(
    "directive, message",
    [
        ("split cpu 0", "split cpu: COUNT must be 1 to 64, got 0"),
        ("split cpu two", "COUNT must be a whole number"),
        ("limit lots", "not a size: 'lots'"),
        ("frobnicate", "unknown directive 'frobnicate'"),
    ],
)
def test_bad_input_is_a_one_line_usage_error(locked_kernel, directive, message):
    """User mistakes become a `UsageError` line; the policy and TensorFlow stay as they were."""
    kernel, _ = locked_kernel
    before = kernel.evaluate(POLICY)
    assert_usage_error(kernel.run(f"%tfgpu {directive}"), message)
    assert kernel.evaluate(POLICY) == before
    assert kernel.evaluate(CPU_COUNT) == 3


# ----- TensorFlow imported, runtime not initialized -------------------------------------------------
RECORDED_CPUS = (
    "len(__import__('tensorflow').config.get_logical_device_configuration("
    "__import__('tensorflow').config.list_physical_devices('CPU')[0]) or [None])"
)
"""Logical CPUs TensorFlow has recorded, read without initializing the runtime."""


@pytest.fixture(scope="module")
def imported_kernel() -> Iterator[dict]:
    """`import tensorflow` (no op), then `split cpu 2`, then `split off`, then the first op."""
    with running_kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic")
        kernel.ok("import tensorflow")
        steps = {"status": kernel.ok("%tfgpu").output, "split": kernel.ok("%tfgpu split cpu 2").stdout}
        steps["recorded"] = kernel.evaluate(RECORDED_CPUS)
        steps["undo"] = kernel.ok("%tfgpu split off").stdout
        steps["undo_status"] = kernel.ok("%tfgpu").output
        steps["cpus"] = kernel.evaluate(CPU_COUNT)
        yield steps


def test_policy_after_import_applies_at_once(imported_kernel):
    """After `import tensorflow` (no op yet) the magic applies immediately, and the op sees it."""
    assert "imported, runtime not initialized" in imported_kernel["status"]
    assert "Applied: logical CPU devices: TF default → 2 logical devices" in imported_kernel["split"]
    assert "restart" not in imported_kernel["split"].lower()
    assert imported_kernel["recorded"] == 2 and imported_kernel["cpus"] == 2


def test_undoing_an_applied_split_honestly_needs_a_restart(imported_kernel):
    """TensorFlow cannot forget a logical configuration: `split off` says so instead of
    'Already in force', and TensorFlow indeed keeps the split."""
    undo = imported_kernel["undo"]
    assert "logical CPU devices: 2 logical devices → TF default" in undo and "restart" in undo.lower()
    assert "Already in force" not in undo
    assert imported_kernel["cpus"] == 2


def test_status_agrees_that_the_undo_needs_a_restart(imported_kernel):
    """The status lists the undo as pending a restart and does not send the user to `%tfgpu apply`
    (which would answer 'cannot change')."""
    status = imported_kernel["undo_status"]
    pending = status.split("Pending, needs a restart:\n", 1)
    assert len(pending) == 2 and "logical CPU devices: 2 logical devices → TF default" in pending[1]
    assert "%tfgpu apply" not in status and "restart" in status.lower()


# ----- nothing heavy on load --------------------------------------------------------------------------
def test_load_ext_and_magic_do_not_import_tensorflow_or_gui():
    """`%load_ext` and an edit import none of TF, keras, ipywidgets, NVML; the status and export
    (which may read the GPU inventory through NVML) still leave TF, keras and ipywidgets alone."""
    with running_kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic")
        assert kernel.loaded_modules(*HEAVY_MODULES) == set()
        kernel.ok("%tfgpu split cpu 2")
        assert kernel.loaded_modules(*HEAVY_MODULES) == set()
        assert "TensorFlow: not imported" in kernel.ok("%tfgpu").output
        assert "LogicalDeviceConfiguration()] * 2" in kernel.ok("%tfgpu export").stdout
        assert kernel.loaded_modules(*HEAVY_MODULES) <= {"pynvml"}
        assert kernel.evaluate(HOOK_ARMED) is True


# ----- default policy from the IPython config -----------------------------------------------------
def default_policy_config(*directives: str) -> str:
    return f"c.TFGPUMagics.default_policy = {list(directives)!r}\n"


def test_configured_default_policy_applies_before_first_op():
    """`c.TFGPUMagics.default_policy` in the profile: `%load_ext` records it, the first op has it."""
    with running_kernel(ipython_config=default_policy_config("split cpu 2", "allocator async")) as kernel:
        kernel.ok("%load_ext tfgpu_magic")
        assert kernel.evaluate(POLICY) == {**EMPTY_POLICY, "cpu_devices": 2, "allocator": "async"}
        assert kernel.ok(FIRST_OP["tensorflow"] + f"print({CPU_COUNT})").stdout.strip() == "2"


def test_bad_configured_default_policy_is_ignored_with_a_message():
    """A broken default policy does not break `%load_ext`: one message, nothing recorded."""
    with running_kernel(ipython_config=default_policy_config("split cpu 2", "split cpu 0")) as kernel:
        loaded = kernel.ok("%load_ext tfgpu_magic")
        assert "ignoring the configured default_policy" in loaded.output and "COUNT must be 1 to 64" in loaded.output
        assert "Traceback" not in loaded.output
        assert kernel.evaluate(POLICY) == EMPTY_POLICY


# ----- %%tfgpu cells: all lines or none -------------------------------------------------------------
GOOD_CELL = "%%tfgpu\n# all or nothing\nsplit cpu 2\nallocator async\ngrowth on\n"
BAD_CELL = "%%tfgpu\nsplit cpu 4\nallocator async\nlimit lots\n"


@pytest.fixture(scope="module")
def cell_kernel() -> Iterator[Kernel]:
    """A fresh kernel with the extension loaded."""
    with running_kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic")
        yield kernel


def test_cell_with_a_bad_line_applies_nothing(cell_kernel):
    """One bad line: a UsageError naming the line; policy and environment untouched."""
    before = cell_kernel.evaluate(POLICY), cell_kernel.evaluate(ENV_PROBE)
    assert_usage_error(cell_kernel.run(BAD_CELL), "line 3: not a size: 'lots'")
    assert (cell_kernel.evaluate(POLICY), cell_kernel.evaluate(ENV_PROBE)) == before


def test_cell_applies_every_line(cell_kernel):
    """Every line lands in the policy and the environment, the split reaches TF, re-running is a no-op."""
    assert cell_kernel.loaded_modules("tensorflow") == set()
    recorded = cell_kernel.ok(GOOD_CELL).stdout
    assert RECORDED in recorded and "TF_GPU_ALLOCATOR=cuda_malloc_async" in recorded
    assert cell_kernel.evaluate(POLICY) == {**EMPTY_POLICY, "cpu_devices": 2, "allocator": "async", "growth": True}
    assert cell_kernel.evaluate(ENV_PROBE) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": None,
        "TF_GPU_ALLOCATOR": "cuda_malloc_async",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "TF_CPP_MIN_LOG_LEVEL": "3",  # inherited from the test kernel's environment (no loglevel here)
        # JAX's and PyTorch's wait for their import (the import hook sets them; neither is imported here)
        "XLA_PYTHON_CLIENT_PREALLOCATE": None, "XLA_CLIENT_MEM_FRACTION": None, "XLA_PYTHON_CLIENT_MEM_FRACTION": None,
        "PYTORCH_CUDA_ALLOC_CONF": None, "PYTORCH_ALLOC_CONF": None,
    }
    assert cell_kernel.ok(f"import tensorflow as tf\ntf.constant(1)\nprint({CPU_COUNT})").stdout.strip() == "2"
    again = cell_kernel.ok(GOOD_CELL)
    # the CPU build has no GPU: its GPU settings are never "in force" (nothing reads them), and nothing waits for a restart
    assert "`growth on` and `allocator async` have nothing to apply to here" in again.stdout
    assert "Already in force" not in again.stdout and "restart" not in again.stdout.lower()
