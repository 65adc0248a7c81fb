"""notebooks/quickstart.ipynb runs top to bottom in a real kernel (nbclient), with the outputs it promises."""

from __future__ import annotations

import pytest
from kernels import tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)
from notebook_runs import NO_DRIVER, assert_quiet, execute, outputs_of, saved_without_outputs, text_of

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]

NOTEBOOK = "quickstart.ipynb"


@pytest.fixture(scope="module")
def executed():
    """The quickstart executed in an isolated kernel (venv Python); nbclient fails on any cell error."""
    return execute(NOTEBOOK)


def test_every_cell_ran_without_error_or_warning(executed):
    """No error outputs and nothing on stderr (with TensorFlow's own logging quieted)."""
    assert_quiet(executed)


def test_saved_without_outputs():
    """The repository keeps the notebook clean; the tests execute a copy in memory."""
    assert saved_without_outputs(NOTEBOOK)


def test_doctor_runs_before_tensorflow_and_names_the_driver(executed):
    """The doctor cell reports the driver check and the CPU-only build of the test venv; it does not
    import TensorFlow (the split cell after it still finds TensorFlow not imported)."""
    (shown,) = outputs_of(executed, "%tfgpu doctor")
    assert "NVIDIA driver" in shown
    assert "CPU-only" in shown  # the test venv installs tensorflow-cpu
    if NO_DRIVER:
        assert "no NVIDIA driver" in shown and "--gpus all" in shown


def test_policy_applied_before_the_first_op(executed):
    """The split recorded before `import tensorflow` gives MirroredStrategy two replicas."""
    (first_op,) = [cell for cell in executed.cells if "MirroredStrategy" in cell.source]
    shown = text_of(first_op)
    assert "replicas in sync: 2" in shown
    assert "device:CPU:1" in shown and "device:CPU:2" not in shown


def test_change_after_initialization_is_reported_as_locked(executed):
    """`split cpu 4` after the first op names the locked setting and the restart, without raising."""
    (shown,) = outputs_of(executed, "%tfgpu split cpu 4")
    assert "cannot change now" in shown
    assert "logical CPU devices: 2 logical devices → 4 logical devices" in shown
    assert "restart" in shown.lower() and "RuntimeError" not in shown


def test_split_cell_waits_for_import_then_reverting_is_already_in_force(executed):
    """Before the import the split is recorded; run again after the locked change it is quiet,
    and the status shows nothing pending."""
    before, after = outputs_of(executed, "%tfgpu split cpu 2\n%tfgpu")
    assert "Recorded; the rest applies when TensorFlow is imported." in before
    assert "TensorFlow: not imported" in before
    assert "Already in force." in after and "CPU:0: 2 logical devices" in after
    assert "Pending" not in after


def test_export_shows_the_policy_as_code(executed):
    """`%tfgpu export` prints a script that splits the CPU in two."""
    (shown,) = outputs_of(executed, "%tfgpu export")
    assert "LogicalDeviceConfiguration()] * 2" in shown
