"""An ipykernel whose NVML is tests/fake_nvml.py's `four_gpus()`: for the browser test's GPU panel
and the doctor on fake cards (tests/test_doctor.py).

Run as a kernelspec's argv (`python tests/fake_gpu_kernel.py -f {connection_file}`, which
`write_kernelspec` writes): it puts the fake at the inventory's chokepoint (`shared_nvml`, the
process's one `Nvml`) before ipykernel starts, so only this kernel process sees the fake cards, with
itself as GPU 0's 1 GiB holder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fake_nvml import FakeNvml, four_gpus

from tfgpu_magic.gpus import inventory

KERNEL_NAME = "fake-gpus"


def write_kernelspec(kernels_dir: Path) -> None:
    """The kernelspec `KERNEL_NAME`, only in a test's Jupyter data dir (`kernels_dir`), running this file."""
    spec = {"argv": [sys.executable, str(Path(__file__).resolve()), "-f", "{connection_file}"],
            "display_name": "tests: fake GPUs", "language": "python"}
    (kernels_dir / KERNEL_NAME).mkdir(parents=True)
    (kernels_dir / KERNEL_NAME / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")


def main() -> None:
    """Install the fake NVML, then run ipykernel on the kernelspec's arguments."""
    nvml = inventory.Nvml(module=FakeNvml(four_gpus()))
    inventory.shared_nvml = lambda: nvml
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
