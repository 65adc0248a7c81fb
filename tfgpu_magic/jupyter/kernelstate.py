"""This kernel's tfgpu state, published for the Jupyter server extension (`tfgpu_magic.serverext`): the
one module that writes and reads the state file, as `tfgpu-state.schema.json` (beside this file)
defines it.

A busy kernel answers nothing (its shell channel waits for the cell), yet during `model.fit` is when
users want to see their GPU memory and policy. So the kernel writes its state when it changes: the
policy, TensorFlow's state and the cell that initialized it, each change that waits (`Pending`, as a
record), whether a restart is needed, and whether a policy kept for its successor will be applied. It
is data, not words: clients word it. One private JSON file named after the kernel id, next to the
kernel's connection file (the Jupyter runtime dir: `safefile.write_atomic`, mode 0600, through a rename,
never through a link), removed when the kernel exits; the server reads it (`read_state`) whatever the
kernel is doing, as hostile input checked against the schema: a bad file spoils only its own kernel.

A write happens on a policy change (`Controller.subscribe`), at `import tensorflow` and when the
runtime is initialized (`tf.events`), and only when the content differs from the last write. JAX and
PyTorch say nothing when they are imported or start (JAX runs its backend hooks holding its backend
lock, before its backends count as started: jax/_src/xla_bridge.py `_init_backend`; PyTorch runs its
queued calls before `torch.cuda.is_initialized()` is true), so after each cell the publisher looks
whether that changed: a few attribute reads (`Publisher.after_cell`). Once the runtime is initialized
with GPUs, a daemon thread also reads TensorFlow's own memory figures every `MEMORY_SECONDS`
(`get_memory_info`: what the kernel's tensors use, the one per-kernel figure a server in a container
can show, where NVML's pids are the host's) and writes when they moved. Only kernels a Jupyter server
started publish (connection file `kernel-<id>.json`): nobody else would read the file.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from . import persist
from ..errors import PolicyError, warn
from ..gpus.processes import server_kernel_id
from ..language.policy import AUTO_PICKED
from ..language.sizes import MIB

if TYPE_CHECKING:
    from ..frameworks import FrameworkView
    from ..gpus.inventory import Inventory
    from ..language.grammar import GpuCatalog
    from ..language.policy import Policy
    from ..tf.apply import Pending
    from ..tf.apply import ConfigAPI
    from ..tf.initcell import InitRecord
    from ..tf.memory import MemoryAPI
    from ..plan import Plan
    from ..tf.runtime import RuntimeState

FORMAT = "tfgpu_magic/kernel-state/2"
PREFIX = "tfgpu-state-"
STATE_BYTES = 64 << 10
"""Largest state file the server reads (a real one is under 4 KiB)."""
SCHEMA = Path(__file__).with_name("tfgpu-state.schema.json")
"""The schema of the state file and of the server extension's replies."""
MEMORY_SECONDS = 2.0
"""How often TensorFlow's memory figures are read once its runtime is initialized with GPUs."""


class StateSource(Protocol):
    """What is published: the controller's public surface (what `tf.memory.MemorySource` reads too)."""

    policy: Policy
    api: ConfigAPI
    catalog: GpuCatalog
    environ: Any

    def state(self) -> RuntimeState: ...
    def plan(self, state: RuntimeState | None = None) -> Plan: ...
    def inventory(self) -> Inventory: ...
    def pending(self, state: RuntimeState | None = None) -> list[Pending]: ...
    def other_frameworks(self) -> list[FrameworkView]: ...
    def frameworks_moment(self) -> tuple[object, ...]: ...
    def framework_memory(self) -> dict[str, list[tuple[str, str | None, int, int | None, int | None]]]: ...
    def subscribe(self, listener: Callable[[Any], None]) -> None: ...
    def unsubscribe(self, listener: Callable[[Any], None]) -> None: ...


class StateInvalid(Exception):
    """A state file that is not one this project wrote (its kernel's entry says so; others are unharmed)."""


def server_connection_file(shell: Any) -> tuple[Path, str] | None:
    """This kernel's connection file and the server's kernel id in its name, from the kernel
    application running `shell` (the kernel's traitlets parent); None outside an ipykernel kernel
    or where no Jupyter server named the file."""
    app = getattr(getattr(shell, "kernel", None), "parent", None)
    name = getattr(app, "abs_connection_file", None)
    kernel_id = server_kernel_id(Path(name)) if isinstance(name, str) else None
    return (Path(name), kernel_id) if kernel_id else None


def state_path(kernel_id: str, directory: Path) -> Path:
    """Where the state of kernel `kernel_id` is published (named like its pending policy file)."""
    pending = persist.pending_path(kernel_id, directory)
    return pending.with_name(PREFIX + pending.name.removeprefix(persist.PENDING_PREFIX))


# ----- the records (data: `tfgpu-state.schema.json`) -----------------------------------------------
def tensorflow_state(state: RuntimeState) -> str:
    """`$defs/tensorflowState`."""
    return "initialized" if state.initialized else "imported" if state.imported else "not_imported"


def policy_record(policy: Policy) -> dict[str, Any]:
    """`$defs/policy`: the policy field by field, sizes in bytes."""
    written = dict(policy.limits_written)
    return {
        "visible": None if policy.visible is None else list(policy.visible),
        "visible_auto": policy.picked_automatically,
        "growth": policy.growth,
        "limits": [{"gpu": gpu, "bytes": mib * MIB, "written": written.get(gpu)} for gpu, mib in policy.limits],
        "limits_share": policy.limits_share,
        "splits": [{"gpu": gpu, "bytes": [mib * MIB for mib in sizes]} for gpu, sizes in policy.splits],
        "cpu_devices": policy.cpu_devices,
        "allocator": policy.allocator,
        "loglevel": policy.loglevel,
    }


KEPT_PICK = AUTO_PICKED + "before the restart"
"""The note on a `visible auto` pick that a restart carried over (its figures are the old kernel's)."""


def policy_from_record(record: dict[str, Any]) -> Policy:
    """The `Policy` a checked `policy_record` describes (the server keeps it for the next kernel);
    `PolicyError` when it is not a valid policy."""
    from ..language.policy import Policy

    limits = tuple((item["gpu"], item["bytes"] // MIB) for item in record["limits"])
    return Policy.from_dict({
        "visible": record["visible"], "growth": record["growth"], "limits": dict(limits),
        "splits": {item["gpu"]: [size // MIB for size in item["bytes"]] for item in record["splits"]},
        "cpu_devices": record["cpu_devices"], "allocator": record["allocator"], "loglevel": record["loglevel"],
    }).edited(limits_written=tuple((item["gpu"], item["written"]) for item in record["limits"] if item["written"]),
              limits_share=record["limits_share"], sources=(("visible", KEPT_PICK),) if record["visible_auto"] else ())


def setting_value(value: Any) -> Any:
    """`$defs/settingValue` of a `Change`'s `current` or `desired`: logical configurations (a tuple of
    memory limits in MiB, None or `LogicalSpec` entries) as logical devices in bytes; flags, device
    names and variable values as they are."""
    if not isinstance(value, tuple):
        return list(value) if isinstance(value, list) else value
    devices = []
    for entry in value:
        if isinstance(entry, tuple):  # a LogicalSpec: (memory_limit, priority, ordinal)
            limit, priority, ordinal = (tuple(entry) + (None, None))[:3]
            devices.append({"memory": None if limit is None else limit * MIB, "priority": priority, "ordinal": ordinal})
        else:
            devices.append({"memory": None if entry is None else entry * MIB})
    return devices


def pending_record(item: Pending) -> dict[str, Any]:
    """`$defs/pendingChange`."""
    change = item.change
    return {"setting": change.setting, "device": change.device, "now": setting_value(change.current),
            "wanted": setting_value(change.desired), "why": item.why, "needs_restart": item.needs_restart}


def init_record(record: InitRecord | None) -> dict[str, Any] | None:
    """`$defs/tensorflow/initialized_by`."""
    return None if record is None else {"where": record.where, "execution_count": record.execution_count,
                                        "line": record.line}


def tensorflow_memory(source: StateSource, api: MemoryAPI | None = None) -> list[dict[str, Any]]:
    """`$defs/tensorflow/memory`: TensorFlow's figures per visible GPU, once its runtime is initialized."""
    from ..tf.memory import memory_rows

    return [{"device": row.tf_device, "card": row.uuid or row.gpu, "current": row.tensors_bytes, "peak": row.peak_bytes}
            for row in memory_rows(source, api) if row.tensors_bytes is not None and row.peak_bytes is not None]


def memory_by_card(record: dict[str, Any], inventory: Inventory) -> dict[int, int]:
    """nvidia-smi index → bytes TensorFlow's allocator says the kernel's tensors use on that card, from
    a checked record's `tensorflow.memory` (the one per-kernel figure where NVML's pids are the host's)."""
    found: dict[int, int] = {}
    for figure in record["tensorflow"]["memory"]:
        index = inventory.card_index(figure["card"]) if figure["card"] is not None else None
        if index is not None:
            found[index] = found.get(index, 0) + figure["current"]
    return found


def snapshot(source: StateSource, kernel_id: str, keep: bool, memory_api: MemoryAPI | None = None) -> dict[str, Any]:
    """The record for `source` now (without the time it was written): `$defs/kernelState`."""
    from ..tf.initcell import initialized_record

    state = source.state()
    pending = source.pending(state)
    return {
        "format": FORMAT,
        "kernel_id": kernel_id,
        "pid": os.getpid(),
        "policy": policy_record(source.policy),
        "tensorflow": {
            "state": tensorflow_state(state),
            "cuda_started": state.cuda_fixed,
            "initialized_by": init_record(initialized_record()) if state.initialized else None,
            "memory": tensorflow_memory(source, memory_api) if state.initialized else [],
        },
        "pending": [pending_record(item) for item in pending],
        "restart_needed": any(item.needs_restart for item in pending),
        "keep": keep,
        "frameworks": frameworks_record(source),
    }


def frameworks_record(source: StateSource) -> dict[str, Any]:
    """`$defs/frameworks`: JAX, PyTorch and Keras as the status shows them, with their own memory figures."""
    views = {view.name: view for view in source.other_frameworks()}
    memory = source.framework_memory() if any(view.started for view in views.values()) else {}

    def framework(name: str) -> dict[str, Any] | None:
        view = views.get(name)
        if view is None:
            return None
        return {"state": "started" if view.started else "imported" if view.imported else "not_imported",
                "version": view.version,
                "variables": [{"name": var, "value": value} for var, value in view.variables],
                "fractions": [{"device": device, "fraction": fraction} for device, fraction in view.fractions],
                "memory": [{"device": device, "card": card, "current": current, "peak": peak, "reserved": reserved}
                           for device, card, current, peak, reserved in memory.get(name, [])]}

    keras = views.get("keras")
    return {"jax": framework("jax"), "torch": framework("torch"),
            "keras": None if keras is None else {"backend": keras.backend, "source": keras.backend_source}}


# ----- reading (the server) --------------------------------------------------------------------------
@functools.cache
def _validator() -> Any:
    """The schema's `kernelState` validator (jsonschema: the server has it, through jupyter_events)."""
    import json

    from jsonschema import Draft202012Validator

    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    return Draft202012Validator({**schema, "$ref": "#/$defs/kernelState"})


def check(data: Any, kernel_id: str) -> dict[str, Any]:
    """`data` as a state record of kernel `kernel_id`; `StateInvalid` saying why it is not one."""
    if not isinstance(data, dict):
        raise StateInvalid(f"not a JSON object but {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise StateInvalid(f"format {str(data.get('format'))[:80]!r}, not {FORMAT!r}")
    try:
        validator = _validator()
    except ImportError:  # a kernel's Python (`%tfgpu who` reads its other kernels) may lack it
        raise StateInvalid("it cannot be checked here: jsonschema is not installed for this Python") from None
    error = next(iter(validator.iter_errors(data)), None)
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "the record"
        raise StateInvalid(f"{where}: {error.message[:200]}")
    if data["kernel_id"] != kernel_id:
        raise StateInvalid(f"written for kernel {data['kernel_id'][:80]!r}")
    return data


_checked: dict[str, tuple[str, dict[str, Any]]] = {}
"""Kernel id → the text of its state file last checked and the record it held: a server polled by many
tabs checks a file against the schema once per change, not once per request."""
CHECKED_KERNELS = 4096
"""Most kernels whose last check is remembered (the server's kernels come and go)."""


def read_state(kernel_id: str, directory: Path, runs_kernel: Callable[[int, str], bool]) -> dict[str, Any] | None:
    """The state kernel `kernel_id` published in `directory`, checked against the schema; None when
    there is none, or the pid in it no longer runs that kernel (killed before it could remove its
    file: `runs_kernel(pid, kernel_id)` tells). `StateInvalid` when the file is not ours or not valid."""
    from .. import safefile

    path = state_path(kernel_id, directory)
    try:
        text = safefile.read_text(path, STATE_BYTES, private=True)
        if text is None:
            return None
        known = _checked.get(kernel_id)
        if known is not None and known[0] == text:
            record = known[1]
        else:
            record = check(safefile.loads(text, str(path)), kernel_id)
            if len(_checked) >= CHECKED_KERNELS:
                _checked.clear()
            _checked[kernel_id] = (text, record)
    except PolicyError as err:
        raise StateInvalid(str(err)) from None
    return record if runs_kernel(record["pid"], kernel_id) else None


# ----- publishing (the kernel) ---------------------------------------------------------------------
class Publisher:
    """Writes `source`'s state for kernel `kernel_id` to `path` whenever `changed()` finds it different."""

    def __init__(self, source: StateSource, kernel_id: str, path: Path, keep: bool,
                 memory_api: MemoryAPI | None = None) -> None:
        self.source = source
        self.kernel_id = kernel_id
        self.path = path
        self.keep = keep
        self.memory_api = memory_api
        self.last: dict[str, Any] | None = None
        self.writes = 0
        self._warned = False
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.watching: threading.Thread | None = None
        self._moment: tuple | None = None
        self.shell_events: Any = None
        """The shell's `events`, where `after_cell` is registered (None outside IPython)."""

    def changed(self, *_: Any) -> bool:
        """Write the state if it differs from the last write; True when it wrote. A controller
        listener (called with the controller), hence the ignored arguments. Once TensorFlow's memory
        figures appear, the memory watch starts."""
        with self._lock:  # the memory watch writes from its own thread
            if self._stopped.is_set():
                return False
            record = snapshot(self.source, self.kernel_id, self.keep, self.memory_api)
            wrote = record != self.last and self._write(record)
        moving = record["tensorflow"]["memory"] or any(framework and framework.get("memory")
                                                       for framework in record["frameworks"].values())
        if moving and self.watching is None and not self._stopped.is_set():
            self.watching = threading.Thread(target=self._watch_memory, name="tfgpu_magic-memory", daemon=True)
            self.watching.start()
        return wrote

    def after_cell(self, *_: Any) -> bool:
        """After each cell (IPython's `post_run_cell`): publish if JAX, Keras or PyTorch was imported or
        started in it (they tell nobody); True when it wrote."""
        try:
            moment = self.source.frameworks_moment()  # TensorFlow's moments come by `tf.events`
            if moment == self._moment:
                return False
            self._moment = moment
            return self.changed()
        except Exception as err:  # a state that cannot be read stops the look, never the cell
            self._stop_looking()
            warn(f"stopped publishing this kernel's state after each cell: {err}")
            return False

    def _stop_looking(self) -> None:
        if self.shell_events is not None and self.after_cell in self.shell_events.callbacks["post_run_cell"]:
            self.shell_events.unregister("post_run_cell", self.after_cell)

    def _watch_memory(self) -> None:
        while not self._stopped.wait(MEMORY_SECONDS):
            try:
                self.changed()
            except Exception as err:  # a figure that cannot be read stops the watch, never the kernel
                warn(f"stopped publishing TensorFlow's memory figures: {err}")
                return

    def _write(self, record: dict[str, Any]) -> bool:
        from .. import safefile

        try:
            safefile.write_atomic(self.path, safefile.dumps({**record, "written": time.time()}) + "\n")
        except (OSError, PolicyError, ValueError) as err:
            if not self._warned:  # the server then shows less; the kernel goes on
                warn(f"could not publish this kernel's state to {self.path}: {err}")
                self._warned = True
            return False
        self.last = record
        self.writes += 1
        return True

    def stop(self) -> None:
        """Stop publishing and remove the file, unless another process (this kernel's successor
        after a restart) has written it since."""
        self._stopped.set()
        self.source.unsubscribe(self.changed)
        self._stop_looking()
        from .. import safefile

        with self._lock:  # no write of the memory watch after this
            try:
                data = safefile.read_json(self.path, STATE_BYTES, private=True)
            except PolicyError:
                return  # not a file we can vouch for: leave it
            if isinstance(data, dict) and data.get("format") == FORMAT and data.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)


_publisher: Publisher | None = None


def can_keep(shell: Any) -> bool:
    """Whether a policy kept for this kernel's successor will be applied: the profile's startup file
    that takes a pending policy is in place (written here if missing, as `%tfgpu restart` does)."""
    profile = getattr(getattr(shell, "profile_dir", None), "location", None)
    if not isinstance(profile, str):
        return False
    try:
        persist.set_pending_startup(profile)
    except (OSError, PolicyError):
        return False
    return True


def start_publishing(shell: Any, source: StateSource, directory: Path | None = None,
                     memory_api: MemoryAPI | None = None) -> Publisher | None:
    """Publish `source`'s state for this kernel from now on (in `directory`, by default its connection
    file's): written now, on every policy change, when TensorFlow's state changes and when its memory
    figures move; removed at exit. `memory_api`: TensorFlow's figures (a fake in tests). None (nothing
    done) outside a kernel a Jupyter server started. Idempotent for the same source; a new source
    replaces the old one."""
    global _publisher
    found = server_connection_file(shell)
    if found is None:
        return None
    connection, kernel_id = found
    if _publisher is not None:
        if _publisher.source is source:
            return _publisher
        stop_publishing()
    import atexit

    from ..tf import events

    path = state_path(kernel_id, directory or connection.parent)
    publisher = Publisher(source, kernel_id, path, can_keep(shell), memory_api)
    source.subscribe(publisher.changed)
    events.subscribe(changed)  # TensorFlow imported or initialized (`tf.initcell` records only after this)
    if hasattr(shell, "events"):
        shell.events.register("post_run_cell", publisher.after_cell)
        publisher.shell_events = shell.events
    atexit.register(publisher.stop)
    _publisher = publisher
    publisher.changed()
    return publisher


def stop_publishing() -> None:
    """Stop the running publisher (if any) and remove its file."""
    global _publisher
    if _publisher is not None:
        import atexit

        from ..tf import events

        events.unsubscribe(changed)
        atexit.unregister(_publisher.stop)
        _publisher.stop()
        _publisher = None


def changed() -> bool:
    """Something outside the policy changed (TensorFlow imported or initialized): publish if the
    state differs. True when a file was written."""
    return _publisher.changed() if _publisher is not None else False
