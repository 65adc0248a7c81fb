"""An ipykernel whose NVML is tests/fake_nvml.py's `four_gpus()`: for the browser test's GPU panel.

Run as a kernelspec's argv (`python tests/fake_gpu_kernel.py -f {connection_file}`): it puts the fake
at the inventory's chokepoint (`shared_nvml`, the process's one `Nvml`) before ipykernel starts, so
only this kernel process sees the fake cards, with itself as GPU 0's 1 GiB holder.
"""

from __future__ import annotations

from fake_nvml import FakeNvml, four_gpus

from tfgpu_magic.gpus import inventory


def main() -> None:
    """Install the fake NVML, then run ipykernel on the kernelspec's arguments."""
    nvml = inventory.Nvml(module=FakeNvml(four_gpus()))
    inventory.shared_nvml = lambda: nvml
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
