"""Run a Python command with tests/fake_nvml.py's four fake GPUs at the inventory's chokepoint.

`python tests/fake_nvml_task.py PYTHON -m MODULE ARGS...`, `... PYTHON -c CODE ARGS...` or
`... PYTHON SCRIPT ARGS...`: a Slurm
job's task (tests/slurm_cluster.py's `fake_nvml_command`) is started by slurmd, outside the test's
process, so the fake must be installed inside the task itself. This installs it (as
tests/fake_gpu_kernel.py does: the process's one `Nvml` wraps `FakeNvml(four_gpus())`) and then runs
the command in this same process, as `python` would (`sys.argv`, `__main__`, `sys.path[0]`).
Only Python commands can see a fake installed in-process: anything else is refused.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from fake_nvml import FakeNvml, four_gpus

from tfgpu_magic.gpus import inventory


def install_fake_nvml() -> None:
    """Four fake GPUs for every NVML reading of this process."""
    nvml = inventory.Nvml(module=FakeNvml(four_gpus()))
    inventory.shared_nvml = lambda: nvml


def main(argv: list[str]) -> None:
    """Install the fake, then run `argv` (a Python command line) in this process."""
    if len(argv) < 2 or "python" not in Path(argv[0]).name:
        raise SystemExit(f"fake_nvml_task: expected PYTHON -m MODULE ... or PYTHON SCRIPT ..., not {argv!r}")
    install_fake_nvml()
    tests_dir = str(Path(__file__).resolve().parent)
    sys.path[:] = [entry for entry in sys.path if entry != tests_dir]  # the tests' helper modules stay out of the task
    if argv[1] == "-m" and len(argv) > 2:
        sys.argv = [argv[2], *argv[3:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    elif argv[1] == "-c" and len(argv) > 2:
        sys.argv = ["-c", *argv[3:]]
        sys.path.insert(0, "")
        exec(compile(argv[2], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = argv[1:]
        sys.path.insert(0, str(Path(argv[1]).resolve().parent))
        runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
