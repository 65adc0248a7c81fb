"""notebooks/quickstart.ipynb runs top to bottom in a real kernel (nbclient), with the outputs it promises."""

from __future__ import annotations

import pytest
from kernels import tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)
from notebook_runs import NO_DRIVER, assert_quiet, execute, outputs_of, saved_without_outputs, text_of

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]

NOTEBOOK = "quickstart.ipynb"


@pytest.fixture(scope="module")
def executed():
    """The quickstart executed in an isolated kernel (venv Python) with TensorFlow's own log defaults,
    as a user's kernel has them; nbclient fails on any cell error."""
    return execute(NOTEBOOK, loud=True)


def test_every_cell_ran_without_error_or_warning(executed):
    """No error outputs and nothing on stderr: TensorFlow's start-up lines (the oneDNN notice, the absl
    preamble, INFO lines, whichever this CPU gives) are hidden by the notebook's `%tfgpu loglevel error`."""
    assert_quiet(executed)


def test_the_loglevel_comes_before_the_import_and_says_why(executed):
    """`%tfgpu loglevel error` is set before `import tensorflow` (else TensorFlow's C++ side has read
    its level already), after a markdown line that says why."""
    cells = executed.cells
    at = next(i for i, cell in enumerate(cells) if cell.source.strip() == "%tfgpu loglevel error")
    importing = next(i for i, cell in enumerate(cells) if "import tensorflow" in cell.source and cell.cell_type == "code")
    assert at < importing and cells[at - 1].cell_type == "markdown"
    assert "noise" in cells[at - 1].source and "before the import" in cells[at - 1].source
    assert outputs_of(executed, "%tfgpu loglevel error") == [
        "Applied: TF_CPP_MIN_LOG_LEVEL=2\nRecorded; the rest applies when TensorFlow is imported.\n"]


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
