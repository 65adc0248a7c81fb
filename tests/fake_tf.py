"""`FakeTF`: the `tfgpu_magic.tf.apply.ConfigAPI` seam with TensorFlow's rules, for GPU paths without a GPU.

The rules are copied once, in the order TensorFlow checks them, from TF 2.21's
`tensorflow/python/eager/context.py` (`Context.set_memory_growth`, `set_logical_device_configuration`,
`set_visible_devices`, the getters and `_compute_device_options`), with the same exception types and
messages. tests/test_fake_parity.py runs the rules that a CPU-only TensorFlow can exercise against
real TensorFlow in a fresh process and requires identical outcomes.

Beyond the seam, the fake plays TensorFlow's life: `list_devices()` (CUDA starts and reads
`CUDA_VISIBLE_DEVICES`), `initialize()` (the runtime starts: settings lock, `TF_FORCE_GPU_ALLOW_GROWTH`
is read) and `in_force()` (what the GPU allocators would really use).

It also models the process-wide C++ side, which outlives any one eager context or session: device
creation by any route (`device_lib.list_local_devices`, a TF1 `Session`, the eager context's
initialization) goes through `create_devices`, the fake's `BaseGPUDeviceFactory::CreateDevices`
(core/common_runtime/gpu/gpu_device.cc): the first creation starts CUDA, fixes the TF-to-CUDA id
mapping (GpuIdManager) and builds each GPU's allocator once (`GPUProcessState::GetGPUAllocator`,
gpu_process_state.cc); later options are ignored. These C++ rules are read from the source, not run:
a CPU-only build never creates GPU devices (tests/test_fake_parity.py runs what CPU can show).
"""

from __future__ import annotations

import collections
import copy
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, MutableMapping, Sequence

from tfgpu_magic.tf.apply import LoggerSet, Route
from tfgpu_magic.tf.runtime import (ASYNC_ALLOCATOR, LIBCUDA_LOADED, CreatedBy, LogicalSpec, RuntimeState,
                                    logical_entries)

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
    """Under cuda_malloc_async always False: there is no BFC allocator to grow."""
    limits: tuple[int | None, ...] | None
    """MiB of each logical GPU on it; None: one logical GPU over the whole card (None inside: a
    logical GPU whose allocator was built over the whole card by an earlier route)."""
    allocator: str = "BFC"
    """"BFC": limits are hard caps; ASYNC_ALLOCATOR: a limit is the shared pool's soft release threshold."""


# ----- TensorFlow's C++ errors (tf.errors.*) and the ConfigProto fields routes carry ------------------
class FakeOpError(Exception):
    """Like `tf.errors.OpError`: `.message` holds TensorFlow's text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownError(FakeOpError): ...
class InvalidArgumentError(FakeOpError): ...
class AlreadyExistsError(FakeOpError): ...
class InternalError(FakeOpError): ...


class _Message:
    """A tiny protobuf message: fields with defaults, `ListFields` (the set ones), `CopyFrom`, `==`."""

    DEFAULTS: dict[str, Any] = {}

    def __init__(self) -> None:
        for name, default in self.DEFAULTS.items():
            setattr(self, name, copy.deepcopy(default))

    def ListFields(self) -> list[tuple[SimpleNamespace, Any]]:  # noqa: N802 (protobuf's name)
        return [(SimpleNamespace(name=name), getattr(self, name)) for name, default in self.DEFAULTS.items()
                if _is_set(getattr(self, name), default)]

    def CopyFrom(self, other: _Message) -> None:  # noqa: N802
        for name in self.DEFAULTS:
            setattr(self, name, copy.deepcopy(getattr(other, name)))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, n) == getattr(other, n) for n in self.DEFAULTS)


def _is_set(value: Any, default: Any) -> bool:
    return value.ListFields() != [] if isinstance(value, _Message) else value != default


class _Repeated(list):
    def add(self) -> VirtualDevices:
        self.append(VirtualDevices())
        return self[-1]


class VirtualDevices(_Message):
    DEFAULTS = {"memory_limit_mb": [], "priority": [], "device_ordinal": []}


class Experimental(_Message):
    DEFAULTS = {"virtual_devices": _Repeated()}


class GPUOptions(_Message):
    DEFAULTS = {"visible_device_list": "", "allow_growth": False, "per_process_gpu_memory_fraction": 0.0,
                "experimental": None}

    def __init__(self) -> None:
        super().__init__()
        self.experimental = Experimental()

    def ListFields(self) -> list[tuple[SimpleNamespace, Any]]:  # noqa: N802
        fields = [f for f in super().ListFields() if f[0].name != "experimental"]
        return fields + ([(SimpleNamespace(name="experimental"), self.experimental)]
                         if self.experimental.ListFields() else [])


class ConfigProto(_Message):
    """The `tf.compat.v1.ConfigProto` fields a device-creating route reads."""

    DEFAULTS = {"gpu_options": None, "device_count": {}}

    def __init__(self) -> None:
        super().__init__()
        self.gpu_options = GPUOptions()


@dataclass(frozen=True)
class DeviceAttributes:
    """What `device_lib.list_local_devices()` returns per device (`DeviceAttributes` proto fields)."""

    name: str
    device_type: str
    memory_limit: int = 0


@dataclass
class _Allocator:
    """One TF GPU id's allocator, built once per process (GPUProcessState::GetGPUAllocator)."""

    cuda_id: int
    kind: str
    growth: bool
    limit: int | None


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
        card_names: Sequence[str] | None = None,
    ) -> None:
        self.uuids = tuple(fake_uuid(i) for i in range(gpus))
        """The machine's GPUs, nvidia-smi order."""
        self.card_names = tuple(card_names or ["NVIDIA A100-SXM4-80GB"] * gpus)
        self.imported = imported
        self.environ = {} if environ is None else environ
        self.state_readable = state_readable
        """False: the private names `runtime_state()` reads are gone (state reads 'not initialized')."""
        self.calls: list[tuple[Any, ...]] = []
        """Every setter call, in order, with its arguments."""
        self.cuda_ids: list[int] | None = None
        """GPUs CUDA enumerates, fixed when CUDA starts (any route, or another library: `start_cuda`)."""
        self.cuda_elsewhere: str | None = None
        """What `runtime.cuda_loaded()` would say (libcuda mapped by another library)."""
        self._physical: list[PhysicalDevice] | None = None
        self._initialized = False
        self._visible: list[PhysicalDevice] = []
        self._growth: dict[PhysicalDevice, bool | None] = {}
        self._virtual: dict[PhysicalDevice, Sequence[LogicalSpec]] = {}
        self._in_force: InForce | None = None
        self._tf_to_cuda: dict[int, int] = {}
        self._allocators: dict[int, _Allocator] = {}
        self._created_by: CreatedBy | None = None
        self.loglevel: str | None = None
        """What the Python loggers were last set to (`set_loglevel`)."""
        self.device_lib = SimpleNamespace(list_local_devices=self._list_local_devices)
        """Stands for `tensorflow.python.client.device_lib` (the routes wrap its attribute)."""
        self.Session = _session_class(self)
        """Stands for `tf.compat.v1.Session` (BaseSession.__init__ creates the devices)."""

    # ----- TensorFlow's life -----------------------------------------------------------------
    def start_cuda(self, by: str | None = None) -> None:
        """CUDA starts (cuInit reads `CUDA_VISIBLE_DEVICES` once per process); `by`: another library
        did it (PyTorch, JAX, CuPy), which `runtime.cuda_loaded()` sees as libcuda in the maps."""
        if self.cuda_ids is None:
            self.cuda_ids = cuda_visible_ids(self.environ.get("CUDA_VISIBLE_DEVICES"), self.uuids)
            self.cuda_elsewhere = by or LIBCUDA_LOADED  # state() shows it until TF lists

    def list_devices(self) -> list[PhysicalDevice]:
        """`_initialize_physical_devices`: CUDA starts once and reads `CUDA_VISIBLE_DEVICES` now."""
        if not self.imported:
            raise SeamMisuse("tf.config used before TensorFlow was imported")
        if self._physical is None:
            self.start_cuda()
            self._physical = [PhysicalDevice("/physical_device:CPU:0", "CPU")] + [
                PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(len(self.cuda_ids))
            ]
            self._visible = list(self._physical)
            self._growth = {d: None for d in self._physical if d.device_type == "GPU"}
        return list(self._physical)

    def initialize(self) -> InForce:
        """`ensure_initialized`: build the device options (may raise), create the devices through the
        process-wide C++ rules (may raise a FakeOpError), then lock everything."""
        self.list_devices()
        if not self._initialized:
            in_force = self._compute_in_force()
            self._initialized = True
            self._in_force = in_force
        return self._in_force

    def create_devices(self, config: ConfigProto | None) -> list[DeviceAttributes]:
        """`BaseGPUDeviceFactory::CreateDevices` (gpu_device.cc) for a session config (None: the
        default SessionOptions, as `device_lib.list_local_devices()` uses). Read, not run."""
        if not self.imported:
            raise SeamMisuse("a device route used before TensorFlow was imported")
        config = config or ConfigProto()
        self.start_cuda()
        options = config.gpu_options
        cpus = config.device_count.get("CPU", 1)
        devices = [DeviceAttributes(f"/device:CPU:{i}", "CPU") for i in range(cpus)]
        # VerifyVirtualDeviceSettings / ParseVisibleDeviceList (gpu_device.cc), in TF's order.
        visible = list(range(len(self.cuda_ids)))
        if options.visible_device_list:
            visible = [int(i) for i in options.visible_device_list.split(",")]
            for index in visible:
                if not 0 <= index < len(self.cuda_ids):
                    raise InvalidArgumentError(f"'visible_device_list' listed an invalid Device id '{index}' but "
                                               f"visible device count is {len(self.cuda_ids)}")
        visible = visible[:config.device_count.get("GPU", len(visible))]
        virtual = list(options.experimental.virtual_devices)
        if virtual:
            if options.per_process_gpu_memory_fraction > 0:
                raise InvalidArgumentError("It's invalid to set per_process_gpu_memory_fraction when "
                                           "virtual_devices is set.")
            if len(visible) < len(virtual):
                raise UnknownError(f"Not enough GPUs to create virtual devices. num_gpus_to_use: {len(visible)} "
                                   f"#virtual_devices: {len(virtual)}")
            if options.visible_device_list and len(visible) != len(virtual):
                raise InvalidArgumentError("The number of GPUs in visible_device_list doesn't match the number "
                                           "of elements in the virtual_devices list.")
            visible = visible[:len(virtual)]
        pairs = []  # (tf id, cuda id, limit) in TF's numbering of the logical GPUs
        for position, index in enumerate(visible):
            limits = list(virtual[position].memory_limit_mb) if virtual else []
            for mib in limits or [None]:
                pairs.append((len(pairs), self.cuda_ids[index], None if mib is None else int(mib)))
        # DeviceIdManager::InsertTfPlatformDeviceIdPair (xla/tsl/framework/device_id_manager.cc; TF < 2.5:
        # GpuIdManager, "multiple CUDA devices"): one TF-to-platform id mapping per process.
        for tf_id, cuda_id, _ in pairs:
            if self._tf_to_cuda.get(tf_id, cuda_id) != cuda_id:
                raise AlreadyExistsError(
                    f"TensorFlow device (GPU:{tf_id}) is being mapped to multiple devices ({cuda_id} now, and "
                    f"{self._tf_to_cuda[tf_id]} previously), which is not supported. This may be the result of "
                    "providing different GPU configurations (ConfigProto.gpu_options, for example different "
                    "visible_device_list) when creating multiple Sessions in the same process. This is not "
                    "currently supported, see https://github.com/tensorflow/tensorflow/issues/19083")
        kind = ASYNC_ALLOCATOR if self.environ.get("TF_GPU_ALLOCATOR") == ASYNC_ALLOCATOR else "BFC"
        # GetAllowGrowthValue (gpu_bfc_allocator.cc): only these exact strings override the option.
        forced = {"true": True, "false": False}.get(self.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", ""))
        growth = options.allow_growth if forced is None else forced
        for tf_id, cuda_id, mib in pairs:
            self._tf_to_cuda[tf_id] = cuda_id
            # GPUProcessState::GetGPUAllocator: built only `if (allocator_parts.allocator == nullptr)`;
            # under cuda_malloc_async no BFC allocator exists, so growth does not apply.
            self._allocators.setdefault(tf_id, _Allocator(cuda_id, kind, growth and kind == "BFC", mib))
            devices.append(DeviceAttributes(f"/device:GPU:{tf_id}", "GPU", self._allocators[tf_id].limit or 0))
        return devices

    def gpus_from(self, devices: list[DeviceAttributes]) -> tuple[GpuInForce, ...]:
        """What the GPU devices of one creation really run with: the process's allocators."""
        by_card: dict[int, list[_Allocator]] = {}
        for device in devices:
            if device.device_type == "GPU":
                allocator = self._allocators[int(device.name.rsplit(":", 1)[1])]
                by_card.setdefault(allocator.cuda_id, []).append(allocator)
        return tuple(
            GpuInForce(cuda_id, allocators[0].growth,
                       None if [a.limit for a in allocators] == [None] else tuple(a.limit for a in allocators),
                       allocators[0].kind)
            for cuda_id, allocators in by_card.items()
        )

    def _list_local_devices(self, session_config: ConfigProto | None = None) -> list[DeviceAttributes]:
        """`device_lib.list_local_devices` (client/device_lib.py): the default config unless given."""
        return self.create_devices(session_config)

    def context_config(self) -> ConfigProto:
        """`Context.config` (eager/context.py): the recorded tf.config settings as a ConfigProto; it lists
        the physical devices first (`_initialize_physical_devices`)."""
        self.list_devices()
        config = ConfigProto()
        gpus = [d for d in self._physical if d.device_type == "GPU"]
        shown = [i for i, d in enumerate(gpus) if d in self._visible]
        config.gpu_options.visible_device_list = ",".join(map(str, shown))
        growths = {self._growth[gpus[i]] for i in shown}
        if self._virtual and shown:
            for i in shown:
                config.gpu_options.experimental.virtual_devices.add().memory_limit_mb.extend(
                    spec.memory_limit for spec in self._virtual.get(gpus[i], ()))
        elif len(growths) > 1:
            raise ValueError("Memory growth cannot differ between GPU devices")
        elif growths:
            config.gpu_options.allow_growth = bool(next(iter(growths)))
        cpu = self._physical[0]
        config.device_count["CPU"] = 0 if cpu not in self._visible else len(self._virtual.get(cpu, (None,)))
        config.device_count["GPU"] = sum(len(self._virtual.get(gpus[i], (None,))) for i in shown)
        return config

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
        """`_compute_device_options` (one, maybe empty, virtual entry per visible GPU once any virtual
        device exists, which drops allow_growth) and `device_count`, then the C++ device creation."""
        config = self.context_config()
        return InForce(gpus=self.gpus_from(self.create_devices(config)), cpus=config.device_count["CPU"])

    # ----- the seam (ConfigAPI) ----------------------------------------------------------------
    def state(self) -> RuntimeState:
        elsewhere = None if self._physical is not None else self.cuda_elsewhere
        if not self.imported:
            return RuntimeState(cuda_elsewhere=elsewhere)
        if not self.state_readable:
            return RuntimeState(imported=True, devices_created=self._created_by)
        return RuntimeState(imported=True, devices_listed=self._physical is not None, initialized=self._initialized,
                            devices_created=self._created_by, cuda_elsewhere=elsewhere)

    def details(self, device: PhysicalDevice) -> dict[str, Any]:
        """`get_device_details`: the card's model name (the fake's cards are named by machine index)."""
        self._known(device)
        if device.device_type != "GPU":
            return {}
        return {"device_name": self.card_names[self.cuda_ids[int(device.name.rsplit(":", 1)[1])]]}

    def getenv(self, name: str) -> str | None:
        return self.environ.get(name)

    def errors(self) -> tuple[type[BaseException], ...]:
        return (FakeOpError,)

    def new_session_config(self) -> ConfigProto:
        return ConfigProto()

    def device_routes(self) -> list[Route]:
        return [
            Route(self.device_lib, "list_local_devices", "device_lib.list_local_devices()", 0, "session_config",
                  True, lambda result, args: any(d.device_type == "GPU" for d in result)),
            Route(self.Session, "__init__", "tf.compat.v1.Session()", 3, "config", False,
                  lambda result, args: any(d.device_type == "GPU" for d in args[0].list_devices())),
        ]

    def record_devices_created(self, route: CreatedBy) -> None:
        self._created_by = self._created_by or route

    def set_loglevel(self, level: str | None) -> list[LoggerSet]:
        """The Python loggers' level (not a device setting, so not among `calls`)."""
        if not self.imported:
            raise SeamMisuse("TensorFlow's loggers set before TensorFlow was imported")
        if level == self.loglevel:
            return []
        self.loglevel = level
        return [LoggerSet("tensorflow", level)]

    def devices(self, kind: str) -> list[PhysicalDevice]:
        return [d for d in self.list_devices() if d.device_type == kind]

    def name(self, device: PhysicalDevice) -> str:
        return device.name.replace("/physical_device:", "")

    def _known(self, device: Any) -> None:
        """Every Context getter and setter starts so (eager/context.py)."""
        if device not in self.list_devices():
            raise ValueError("Unrecognized device: %s" % repr(device))

    def get_growth(self, device: PhysicalDevice) -> bool | None:
        """`Context.get_memory_growth` (eager/context.py): `_memory_growth_map[dev]`."""
        self._known(device)
        return self._growth[device]  # KeyError for a CPU, as in TensorFlow

    def set_growth(self, device: PhysicalDevice, enable: bool) -> None:
        """`Context.set_memory_growth` (eager/context.py), its checks in TF's order."""
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

    def get_logical(self, device: PhysicalDevice) -> tuple[int | None | LogicalSpec, ...] | None:
        """`Context.get_logical_device_configuration` (eager/context.py), through the runtime's reading."""
        self._known(device)
        return logical_entries(self._virtual.get(device))

    def set_logical(self, device: PhysicalDevice, limits: Sequence[int | None]) -> None:
        """What `TensorFlowConfig.set_logical` passes: a list of plain configurations."""
        self.calls.append(("set_logical", self.name(device), tuple(limits)))
        self.set_user_logical(device, [LogicalSpec(mib) for mib in limits])

    def set_user_logical(self, device: PhysicalDevice, configs: Sequence[LogicalSpec]) -> None:
        """`Context.set_logical_device_configuration` with the user's own configurations, stored as
        given: TF compares with `==`, so a tuple never equals a list, and priority and ordinal count."""
        self._known(device)
        if device.device_type == "CPU":
            for spec in configs:
                if spec.memory_limit is not None:
                    raise ValueError("Setting memory limit on CPU virtual devices is currently not supported")
                if spec.priority is not None:
                    raise ValueError("Setting experimental_priority on CPU virtual  devices is currently not supported")
                if spec.ordinal is not None:
                    raise ValueError("Setting experimental_device_ordinal on CPU virtual  devices is currently not "
                                     "supported")
        elif device.device_type == "GPU":
            if any(spec.memory_limit is None for spec in configs):
                raise ValueError("Setting memory limit is required for GPU virtual devices")
        else:
            raise ValueError("Virtual devices are not supported for %s" % device.device_type)
        if self._virtual.get(device) == configs:
            return
        if self._initialized:
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        self._virtual[device] = configs

    def get_visible(self, kind: str) -> list[PhysicalDevice]:
        """`Context.get_visible_devices` (eager/context.py)."""
        self.list_devices()
        return [d for d in self._visible if d.device_type == kind]

    def set_visible(self, devices: list[PhysicalDevice], kind: str) -> None:
        """`Context.set_visible_devices` (eager/context.py): devices of other kinds stay as they are."""
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


def _session_class(fake: FakeTF) -> type:
    """A `Session` class bound to `fake`: `BaseSession.__init__` (client/session.py) takes the eager
    context's config when given none, then creates its devices (DirectSession)."""

    class Session:
        def __init__(self, target: str = "", graph: Any = None, config: ConfigProto | None = None) -> None:
            self.config = fake.context_config() if config is None else config
            self._devices = fake.create_devices(self.config)

        def list_devices(self) -> list[DeviceAttributes]:
            return list(self._devices)

        def gpus_in_force(self) -> tuple[GpuInForce, ...]:
            return fake.gpus_from(self._devices)

    return Session
