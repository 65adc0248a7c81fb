"""`FakeTF`: the `tfgpu_magic.runtime.ConfigAPI` seam with TensorFlow's rules, for GPU paths without a GPU.

The rules are copied once, in the order TensorFlow checks them, from TF 2.21's
`tensorflow/python/eager/context.py` (`Context.set_memory_growth`, `set_logical_device_configuration`,
`set_visible_devices`, the getters and `_compute_device_options`), with the same exception types and
messages. tests/test_fake_parity.py runs the rules that a CPU-only TensorFlow can exercise against
real TensorFlow in a fresh process and requires identical outcomes.

Beyond the seam, the fake plays TensorFlow's life: `list_devices()` (CUDA starts and reads
`CUDA_VISIBLE_DEVICES`), `initialize()` (the runtime starts: settings lock, `TF_FORCE_GPU_ALLOW_GROWTH`
is read) and `in_force()` (what the GPU allocators would really use).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, MutableMapping, Sequence

from tfgpu_magic.runtime import RuntimeState

PhysicalDevice = collections.namedtuple("PhysicalDevice", ["name", "device_type"])
"""Same name, fields, equality and repr as `tf.config.PhysicalDevice` (a namedtuple too)."""


class SeamMisuse(AssertionError):
    """The code under test used `tf.config` while TensorFlow is not imported (the real seam would
    import TensorFlow there, before the policy's environment is in place)."""


@dataclass(frozen=True)
class GpuInForce:
    """What one visible GPU's allocator really uses once the runtime is initialized."""

    cuda_id: int
    """The GPU's index on the machine (nvidia-smi numbering; the fake has one device order)."""
    growth: bool
    limits: tuple[int, ...] | None
    """MiB of each logical GPU on it; None: one logical GPU over the whole card."""


@dataclass(frozen=True)
class InForce:
    """The device setup TensorFlow's runtime is created with."""

    gpus: tuple[GpuInForce, ...]
    """Visible GPUs in TensorFlow's order."""
    cpus: int
    """Logical CPU devices."""


def fake_uuid(index: int) -> str:
    """GPU `index`'s UUID on the fake machine (`GPU-<index>...`: a one-character unique prefix)."""
    return f"GPU-{index}{index:07x}-fa6e-4e0d-9b1a-{index:012x}"


def cuda_visible_ids(value: str | None, uuids: Sequence[str]) -> list[int]:
    """GPU ids CUDA enumerates for `CUDA_VISIBLE_DEVICES=value`: indices and full or prefix GPU UUIDs,
    in the order given; parsing stops at the first invalid entry; `""` hides every GPU, unset shows all."""
    if value is None:
        return list(range(len(uuids)))
    ids: list[int] = []
    for token in (t.strip() for t in value.split(",")):
        matches = [i for i, uuid in enumerate(uuids) if token and uuid.lower().startswith(token.lower())]
        if token.isdigit() and int(token) < len(uuids):
            found = int(token)
        elif token.upper().startswith("GPU-") and len(matches) == 1:
            found = matches[0]
        else:
            break
        if found in ids:
            break
        ids.append(found)
    return ids


class FakeTF:
    """A TensorFlow process with `gpus` GPUs and one CPU, seen through the `ConfigAPI` seam."""

    def __init__(
        self,
        gpus: int = 0,
        *,
        imported: bool = True,
        environ: MutableMapping[str, str] | None = None,
        state_readable: bool = True,
    ) -> None:
        self.uuids = tuple(fake_uuid(i) for i in range(gpus))
        """The machine's GPUs, nvidia-smi order."""
        self.imported = imported
        self.environ = {} if environ is None else environ
        self.state_readable = state_readable
        """False: the private names `runtime_state()` reads are gone (state reads 'not initialized')."""
        self.calls: list[tuple[Any, ...]] = []
        """Every setter call, in order, with its arguments."""
        self.cuda_ids: list[int] | None = None
        self._physical: list[PhysicalDevice] | None = None
        self._initialized = False
        self._visible: list[PhysicalDevice] = []
        self._growth: dict[PhysicalDevice, bool | None] = {}
        self._virtual: dict[PhysicalDevice, tuple[int | None, ...]] = {}
        self._in_force: InForce | None = None

    # ----- TensorFlow's life -----------------------------------------------------------------
    def list_devices(self) -> list[PhysicalDevice]:
        """`_initialize_physical_devices`: CUDA starts once and reads `CUDA_VISIBLE_DEVICES` now."""
        if not self.imported:
            raise SeamMisuse("tf.config used before TensorFlow was imported")
        if self._physical is None:
            self.cuda_ids = cuda_visible_ids(self.environ.get("CUDA_VISIBLE_DEVICES"), self.uuids)
            self._physical = [PhysicalDevice("/physical_device:CPU:0", "CPU")] + [
                PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(len(self.cuda_ids))
            ]
            self._visible = list(self._physical)
            self._growth = {d: None for d in self._physical if d.device_type == "GPU"}
        return list(self._physical)

    def initialize(self) -> InForce:
        """`ensure_initialized`: build the device options (may raise), then lock everything."""
        self.list_devices()
        if not self._initialized:
            in_force = self._compute_in_force()
            self._initialized = True
            self._in_force = in_force
        return self._in_force

    def in_force(self) -> InForce:
        """The setup the runtime was created with; only after `initialize()`."""
        assert self._in_force is not None, "the runtime is not initialized"
        return self._in_force

    def snapshot(self) -> tuple:
        """Everything TensorFlow has recorded, to compare before and after."""
        return (
            self.cuda_ids,
            tuple(self._visible),
            tuple(sorted(self._growth.items())),
            tuple(sorted(self._virtual.items())),
            self._initialized,
        )

    def _compute_in_force(self) -> InForce:
        """`_compute_device_options` and `device_count`, then what the allocators do with them."""
        visible_gpus = [d for d in self._physical if d.device_type == "GPU" and d in self._visible]
        growths = {self._growth[d] for d in visible_gpus}
        virtual = bool(self._virtual) and bool(visible_gpus)  # one (maybe empty) entry per visible GPU
        if not virtual and len(growths) > 1:
            raise ValueError("Memory growth cannot differ between GPU devices")
        allow_growth = None if virtual or not growths else next(iter(growths))
        # GetAllowGrowthValue (gpu_bfc_allocator.cc): only these exact strings override the option.
        forced = {"true": True, "false": False}.get(self.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", ""))
        growth = bool(allow_growth) if forced is None else forced
        cpu = self._physical[0]
        return InForce(
            gpus=tuple(
                GpuInForce(self.cuda_ids[int(d.name.rsplit(":", 1)[1])], growth, self._virtual.get(d) or None)
                for d in visible_gpus
            ),
            cpus=0 if cpu not in self._visible else len(self._virtual.get(cpu, (None,))),
        )

    # ----- the seam (ConfigAPI) ----------------------------------------------------------------
    def state(self) -> RuntimeState:
        if not self.imported:
            return RuntimeState()
        if not self.state_readable:
            return RuntimeState(imported=True)
        return RuntimeState(imported=True, devices_listed=self._physical is not None, initialized=self._initialized)

    def devices(self, kind: str) -> list[PhysicalDevice]:
        return [d for d in self.list_devices() if d.device_type == kind]

    def name(self, device: PhysicalDevice) -> str:
        return device.name.replace("/physical_device:", "")

    def _known(self, device: Any) -> None:
        if device not in self.list_devices():
            raise ValueError("Unrecognized device: %s" % repr(device))

    def get_growth(self, device: PhysicalDevice) -> bool | None:
        self._known(device)
        return self._growth[device]  # KeyError for a CPU, as in TensorFlow

    def set_growth(self, device: PhysicalDevice, enable: bool) -> None:
        self.calls.append(("set_growth", self.name(device), enable))
        self._known(device)
        if device in self._virtual:
            raise ValueError("Cannot set memory growth on device when virtual devices configured")
        if device.device_type != "GPU":
            raise ValueError("Cannot set memory growth on non-GPU and non-Pluggable devices")
        if self._growth.get(device) == enable:
            return
        if self._initialized:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self._growth[device] = enable

    def get_logical(self, device: PhysicalDevice) -> tuple[int | None, ...] | None:
        self._known(device)
        return self._virtual.get(device)

    def set_logical(self, device: PhysicalDevice, limits: Sequence[int | None]) -> None:
        limits = tuple(limits)
        self.calls.append(("set_logical", self.name(device), limits))
        self._known(device)
        if device.device_type == "CPU":
            if any(mib is not None for mib in limits):
                raise ValueError("Setting memory limit on CPU virtual devices is currently not supported")
        elif device.device_type == "GPU":
            if any(mib is None for mib in limits):
                raise ValueError("Setting memory limit is required for GPU virtual devices")
        else:
            raise ValueError("Virtual devices are not supported for %s" % device.device_type)
        if self._virtual.get(device) == limits:
            return
        if self._initialized:
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        self._virtual[device] = limits

    def get_visible(self, kind: str) -> list[PhysicalDevice]:
        self.list_devices()
        return [d for d in self._visible if d.device_type == kind]

    def set_visible(self, devices: list[PhysicalDevice], kind: str) -> None:
        self.calls.append(("set_visible", [self.name(d) for d in devices], kind))
        physical = self.list_devices()
        for device in devices:
            if device not in physical or device.device_type != kind:
                raise ValueError("Unrecognized device: %s" % repr(device))
        visible = [d for d in self._visible if d.device_type != kind] + list(devices)
        if self._visible == visible:
            return
        if self._initialized:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self._visible = visible
