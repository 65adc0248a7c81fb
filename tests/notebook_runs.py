"""Executing the project's notebooks as CI does: nbclient, a real isolated kernel (see `kernels`), real TF CPU.

The notebook is read from `notebooks/` and executed in memory, so the saved file keeps no outputs.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import nbformat
from kernels import CELL_TIMEOUT, QUIET_ENV, STARTUP_TIMEOUT, kernel_manager, quiet_env
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ALLOWED_TO_FAIL = "raises-exception"
"""nbclient's cell tag for a cell whose error is part of what the notebook shows."""
NO_DRIVER = not any(Path(p).exists() for p in ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg"))
"""No NVIDIA driver on this machine (the CI machine), so what the doctor and NVML-based directives say is known."""


def execute(name: str, loud: bool = False) -> nbformat.NotebookNode:
    """`notebooks/<name>` executed top to bottom in an isolated kernel; nbclient fails on any untagged
    cell error. `loud`: with TensorFlow's own log defaults, as a user's kernel has them (else quieted)."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    with tempfile.TemporaryDirectory(prefix="tfgpu-nb-") as tmp:
        manager = kernel_manager(Path(tmp), asynchronous=True)
        if loud:
            spec_file = Path(tmp) / "kernels" / manager.kernel_name / "kernel.json"
            spec = json.loads(spec_file.read_text())
            spec["env"] = {key: value for key, value in spec["env"].items() if key not in QUIET_ENV}
            spec_file.write_text(json.dumps(spec))
        client = NotebookClient(
            nb,
            km=manager,
            timeout=CELL_TIMEOUT,
            startup_timeout=STARTUP_TIMEOUT,
            allow_errors=False,
            resources={"metadata": {"path": tmp}},
        )
        environ = {key: value for key, value in quiet_env().items() if not (loud and key in QUIET_ENV)}
        client.execute(cleanup_kc=True, env=environ)  # cleanup_kc: shut down the kernel we made
    return nb


def text_of(cell: nbformat.NotebookNode) -> str:
    """What the cell shows, as text: streams, results, displays, errors."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}")
        else:
            parts.append(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def outputs_of(nb: nbformat.NotebookNode, source: str) -> list[str]:
    """The output texts of the code cells whose source is `source`, in notebook order."""
    outputs = [text_of(cell) for cell in nb.cells if cell.cell_type == "code" and cell.source.strip() == source]
    assert outputs, f"no cell {source!r}"
    return outputs


def shown_by(nb: nbformat.NotebookNode, cell_id: str) -> str:
    """The output text of the cell with id `cell_id`."""
    (cell,) = [cell for cell in nb.cells if cell.get("id") == cell_id]
    return text_of(cell)


def assert_quiet(nb: nbformat.NotebookNode) -> None:
    """No error output and nothing on stderr (TensorFlow's logging quieted), except in cells tagged
    `ALLOWED_TO_FAIL`."""
    for cell in nb.cells:
        if ALLOWED_TO_FAIL in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []):
            assert output.output_type != "error", cell.source
            assert output.get("name") != "stderr", f"{cell.source}: {output.get('text')}"


def saved_without_outputs(name: str) -> bool:
    """Whether `notebooks/<name>` is saved clean: no outputs, no execution counts."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    return all(not cell.outputs and cell.execution_count is None for cell in code)
