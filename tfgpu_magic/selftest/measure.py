"""What a selftest child reads of the GPUs: through the package's one NVML chokepoint
(`gpus.inventory`), never TensorFlow, so the tests can feed it tests/fake_nvml.py's cards."""

from __future__ import annotations

from typing import Any

from ..gpus.inventory import Inventory, self_mib


def cards(inventory: Inventory) -> dict[str, dict[str, Any]]:
    """Per GPU UUID: its nvidia-smi index, total and free MiB, whether NVML lists this process on it
    and the MiB it holds there (None: unknown), as JSON-ready values."""
    return {
        gpu.uuid: {
            "index": gpu.index,
            "total_mib": gpu.memory_total_mib,
            "free_mib": gpu.memory_free_mib,
            "listed": any(process.is_self for process in gpu.processes),
            "mine_mib": self_mib(gpu),
        }
        for gpu in inventory.gpus
    }


def processes(inventory: Inventory) -> list[dict[str, Any]]:
    """Every compute process NVML lists: its GPU (nvidia-smi index), pid and MiB (None: unknown)."""
    return [{"gpu": gpu.index, "pid": process.pid, "mib": process.used_mib}
            for gpu in inventory.gpus for process in gpu.processes]
