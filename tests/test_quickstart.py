"""notebooks/quickstart.ipynb runs top to bottom in a real kernel (nbclient), with the outputs it promises."""

from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat
import pytest
from kernels import CELL_TIMEOUT, STARTUP_TIMEOUT, kernel_manager, quiet_env
from kernels import tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)
from nbclient import NotebookClient

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"


@pytest.fixture(scope="module")
def executed() -> nbformat.NotebookNode:
    """The quickstart executed in an isolated kernel (venv Python); nbclient fails on any cell error."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with tempfile.TemporaryDirectory(prefix="tfgpu-nb-") as tmp:
        client = NotebookClient(
            nb,
            km=kernel_manager(Path(tmp), asynchronous=True),
            timeout=CELL_TIMEOUT,
            startup_timeout=STARTUP_TIMEOUT,
            allow_errors=False,
            resources={"metadata": {"path": tmp}},
        )
        client.execute(cleanup_kc=True, env=quiet_env())  # cleanup_kc: shut down the kernel we made
    return nb


def text_of(cell: nbformat.NotebookNode) -> str:
    """What the cell shows, as text: streams, results, displays."""
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def outputs_of(nb: nbformat.NotebookNode, source: str) -> list[str]:
    """The output texts of the code cells whose source is `source`, in notebook order."""
    outputs = [text_of(cell) for cell in nb.cells if cell.cell_type == "code" and cell.source.strip() == source]
    assert outputs, f"no cell {source!r}"
    return outputs


def test_every_cell_ran_without_error_or_warning(executed):
    """No error outputs and nothing on stderr (with TensorFlow's own logging quieted)."""
    for cell in executed.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", cell.source
            assert output.get("name") != "stderr", f"{cell.source}: {output.get('text')}"


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
