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
can show, where NVML's pids are the host's) and writes when they moved: only the figures, no plan; the
whole state (one plan) only where it may have changed (`Publisher._tick`). The last cells' start and end
(`pre_run_cell`/`post_run_cell`: a clock read each, kept in memory) go out with the next write, so the
server can mark its memory history with the cell that ran (`serverext.history`): no write per cell. Only
kernels a Jupyter server started publish (connection file `kernel-<id>.json`): nobody else would read
the file.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

from . import persist
from ..errors import PolicyError, warn
from ..gpus.processes import server_kernel_id
from .staterecords import init_record, pending_record, policy_record, tensorflow_memory, tensorflow_state
from .staterecords import policy_from_record  # noqa: F401 (the server and its tests read it here)

if TYPE_CHECKING:
    from ..frameworks import FrameworkMemory, FrameworkView
    from ..gpus.inventory import Inventory
    from ..language.grammar import GpuCatalog
    from ..language.policy import Policy
    from ..tf.apply import Pending
    from ..tf.apply import ConfigAPI
    from ..tf.memory import GpuMemory, MemoryAPI
    from ..plan import Plan
    from ..tf.runtime import RuntimeState

SCHEMA = Path(__file__).with_name("tfgpu-state.schema.json")
"""The schema of the state file and of the server extension's replies: the one place their shapes, error
codes and version are written (the browser's types are generated from it: labextension/scripts/schema.mjs)."""


@functools.cache
def contract() -> dict[str, Any]:
    """The schema, read once per process (the package's own file: trusted)."""
    return json.loads(SCHEMA.read_text(encoding="utf-8"))


def format_of(definition: str) -> str:
    """The `format` a record of `$defs/<definition>` carries: what the record is, not its version."""
    return contract()["$defs"][definition]["properties"]["format"]["const"]


def schema_version() -> int:
    """The contract's version: `$defs/version`, the one place the schema writes it."""
    return contract()["$defs"]["version"]["const"]


def stamp(definition: str) -> dict[str, Any]:
    """What every record of `$defs/<definition>` starts with: its `format` and the contract's `version`."""
    return {"format": format_of(definition), "version": schema_version()}


FORMAT = format_of("kernelState")
STAMP = stamp("kernelState")
PREFIX = "tfgpu-state-"
STATE_BYTES = 64 << 10
"""Largest state file the server reads (a real one is under 4 KiB)."""
STATE_INVALID = "state_invalid"
"""`$defs/errorCode` of a state file that is not one tfgpu_magic wrote."""
JSONSCHEMA_MISSING = "jsonschema_missing"
"""`$defs/errorCode` of a state file this Python cannot check: no jsonschema."""
JSONSCHEMA_OLD = "jsonschema_old"
"""`$defs/errorCode` of a state file this Python cannot check: a jsonschema without the schema's draft."""
JSONSCHEMA_OLDEST = "4.0"
"""The first jsonschema with `Draft202012Validator` (the schema's draft, 2020-12)."""
MEMORY_SECONDS = 2.0
"""How often TensorFlow's memory figures are read once its runtime is initialized with GPUs."""
FAILED_TICKS_WAIT = 8
"""Most `MEMORY_SECONDS` the watch waits after failed ticks in a row (1, 2, 4, then this many)."""
CELLS_PUBLISHED = 16
"""The last cells a state names (`$defs/kernelState/cells`): more cells than this between two looks of the
watch (`MEMORY_SECONDS`) lose the oldest, cells too short to carry a sample of the server's anyway."""


class StateSource(Protocol):
    """What is published: the controller's public surface (what `tf.memory.MemorySource` reads too)."""

    policy: Policy
    api: ConfigAPI
    catalog: GpuCatalog
    environ: Any

    def state(self) -> RuntimeState: ...
    def plan(self, state: RuntimeState | None = None, imports: bool = False) -> Plan: ...
    def inventory(self) -> Inventory: ...
    def pending(self, state: RuntimeState | None = None, plan: Plan | None = None) -> list[Pending]: ...
    def other_frameworks(self, plan: Plan | None = None) -> list[FrameworkView]: ...
    def frameworks_moment(self) -> tuple[object, ...]: ...
    def framework_memory(self, state: RuntimeState | None = None,
                         plan: Plan | None = None) -> dict[str, list[FrameworkMemory]]: ...
    def subscribe(self, listener: Callable[[Any], None]) -> None: ...
    def unsubscribe(self, listener: Callable[[Any], None]) -> None: ...


class StateInvalid(Exception):
    """A state file that is not one this project wrote, or one this Python cannot check (`code`, a
    `$defs/errorCode`, says which); its kernel's entry says so, others are unharmed."""

    def __init__(self, message: str, code: str = STATE_INVALID) -> None:
        super().__init__(message)
        self.code = code


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


# ----- the records (data: `tfgpu-state.schema.json`; most in `staterecords`) -------------------------
BYTES_MAX = (1 << 53) - 1
"""The schema's `$defs/bytes` maximum (JavaScript's largest exact integer): sums of figures stop there."""


def add_bytes(total: int, more: int | float) -> int:
    """`total + more` as an integer, stopping at `BYTES_MAX`: a checked figure may be written as a float
    (`1e15` is a JSON integer), and a sum of valid figures must stay a valid figure."""
    return min(BYTES_MAX, total + int(more))


def figures_by_card(figures: list[dict[str, Any]], inventory: Inventory, key: str) -> dict[int, int]:
    """nvidia-smi index → the sum of `figure[key]` over a checked record's memory `figures` on that card
    (a framework's devices on one card: logical devices, a split); figures without a known card or with
    a null `key` are left out."""
    found: dict[int, int] = {}
    for figure in figures:
        index = inventory.card_index(figure["card"]) if figure["card"] is not None else None
        if index is not None and figure[key] is not None:
            found[index] = add_bytes(found.get(index, 0), figure[key])
    return found


def memory_by_card(record: dict[str, Any], inventory: Inventory) -> dict[int, int]:
    """nvidia-smi index → bytes TensorFlow's allocator says the kernel's tensors use on that card, from
    a checked record's `tensorflow.memory` (the one per-kernel figure where NVML's pids are the host's)."""
    return figures_by_card(record["tensorflow"]["memory"], inventory, "current")


class Look(NamedTuple):
    """A full look (`look`): its record, and what `figures` reads the figures on until the state may have
    changed: the state, its plan, TensorFlow's rows (cards, logical devices, caps), the frameworks shown."""

    record: dict[str, Any]
    state: RuntimeState
    plan: Plan
    rows: list[GpuMemory]
    views: list[FrameworkView]


def snapshot(source: StateSource, kernel_id: str, keep: bool, memory_api: MemoryAPI | None = None) -> dict[str, Any]:
    """The record for `source` now (without the time it was written): `$defs/kernelState`."""
    return look(source, kernel_id, keep, memory_api).record


def look(source: StateSource, kernel_id: str, keep: bool, memory_api: MemoryAPI | None = None) -> Look:
    """The whole state now, with one plan handed down; its record is `snapshot`'s."""
    from ..tf.initcell import initialized_record
    from ..tf.memory import memory_rows

    state = source.state()
    plan = source.plan(state, imports=True)
    pending = source.pending(state, plan)
    rows = memory_rows(source, memory_api, state=state, plan=plan) if state.initialized else []
    views = source.other_frameworks(plan)
    record = {
        **STAMP,
        "kernel_id": kernel_id,
        "pid": os.getpid(),
        "policy": policy_record(source.policy),
        "tensorflow": {
            "state": tensorflow_state(state),
            "cuda_started": state.cuda_fixed,
            "initialized_by": init_record(initialized_record()) if state.initialized else None,
            "memory": tensorflow_memory(rows),
        },
        "pending": [pending_record(item) for item in pending],
        "restart_needed": any(item.needs_restart for item in pending),
        "keep": keep,
        "frameworks": frameworks_record(source, views, state, plan),
    }
    return Look(record, state, plan, rows, views)


def figures(source: StateSource, last: Look, memory_api: MemoryAPI | None = None) -> dict[str, Any] | None:
    """`last`'s record with only the figures that move between cells read afresh (TensorFlow's tensor counts
    on its rows, JAX's and PyTorch's own); None where the runtime was initialized since (a full look then)."""
    from ..tf.memory import TensorFlowMemory, with_tensor_figures

    rows = with_tensor_figures(last.rows, memory_api or TensorFlowMemory())
    return None if rows is None else {
        **last.record, "tensorflow": {**last.record["tensorflow"], "memory": tensorflow_memory(rows)},
        "frameworks": frameworks_record(source, last.views, last.state, last.plan)}


def frameworks_record(source: StateSource, shown: list[FrameworkView], state: RuntimeState,
                      plan: Plan) -> dict[str, Any]:
    """`$defs/frameworks`: JAX, PyTorch and Keras as the status shows them (`shown`), with their own memory
    figures (read only once one started)."""
    views = {view.name: view for view in shown}
    memory = source.framework_memory(state, plan) if any(view.started for view in shown) else {}

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
    """The schema's `kernelState` validator. jsonschema is a dependency of the server extension (and
    of jupyter_server itself, through jupyter_events); a kernel's Python (`%tfgpu who`) may lack it, or
    hold one older than the schema's draft: `StateInvalid` says which, never that the file is not ours."""
    try:
        import jsonschema
    except ImportError:
        raise StateInvalid("it cannot be checked here: jsonschema is not installed for this Python",
                           JSONSCHEMA_MISSING) from None
    validator = getattr(jsonschema, "Draft202012Validator", None)
    if validator is None:
        raise StateInvalid(f"it cannot be checked here: jsonschema {_installed_version()} is older than "
                           f"{JSONSCHEMA_OLDEST}, the first to know the schema's draft (2020-12)", JSONSCHEMA_OLD)
    return validator({**contract(), "$ref": "#/$defs/kernelState"})


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jsonschema")
    except PackageNotFoundError:
        return "(of unknown version)"


def check(data: Any, kernel_id: str) -> dict[str, Any]:
    """`data` as a state record of kernel `kernel_id`; `StateInvalid` saying why it is not one."""
    if not isinstance(data, dict):
        raise StateInvalid(f"not a JSON object but {type(data).__name__}")
    written = {key: data.get(key) for key in STAMP}
    if written != STAMP:  # another record, or another version's (whose `format` ended in its version up to 3)
        raise StateInvalid(f"format {str(written['format'])[:80]!r} version {str(written['version'])[:20]}, "
                           f"not {FORMAT!r} version {STAMP['version']}: not this tfgpu_magic's state file")
    error = next(iter(_validator().iter_errors(data)), None)
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
        self._tick_failed = False
        self.log: logging.Logger | logging.LoggerAdapter = logging.getLogger(__name__)
        """Where a failed tick is logged: the kernel's own log once `start_publishing` knows the kernel."""
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.watching: threading.Thread | None = None
        self.moving = False
        """The last record had memory figures: the watch reads them on each look."""
        self._cells_seen: tuple[tuple[int | None, float, float | None], ...] = ()
        self._moment: tuple | None = None
        self._look: Look | None = None
        """The last full look: a tick reads the figures on it while only they can have moved."""
        self.shell: Any = None
        """The shell whose cells are marked (its `execution_count`); None outside IPython."""
        self.shell_events: Any = None
        """The shell's `events`, where `before_cell` and `after_cell` are registered (None outside IPython)."""
        self.cells: deque[tuple[int | None, float, float | None]] = deque(maxlen=CELLS_PUBLISHED)
        """(In [n], start, end or None while running) of the last cells: memory only, written with the
        next write (the watch's, every `MEMORY_SECONDS`, started by the first cell), never one per cell."""

    def changed(self, *_: Any, full: bool = True) -> bool:
        """Write the state if it differs from the last write; True when it wrote. A controller
        listener (called with the controller), hence the ignored arguments. Once TensorFlow's memory
        figures appear, the watch starts and reads them every `MEMORY_SECONDS`. Not `full`: only the figures
        on the last full look (`figures`), unless a cell started or ended since or the look is stale."""
        with self._lock:  # the watch writes from its own thread
            if self._stopped.is_set():
                return False
            cells = tuple(self.cells)  # one step under the GIL, whichever thread appends
            last = None if full or cells != self._cells_seen else self._look
            record = figures(self.source, last, self.memory_api) if last is not None else None
            if record is None:
                self._look = look(self.source, self.kernel_id, self.keep, self.memory_api)
                record = self._look.record
            record = {**record, "cells": [{"execution_count": count, "start": start, "end": end}
                                          for count, start, end in cells]}
            unchanged = record == self.last
            wrote = not unchanged and self._write(record)
            if wrote or unchanged:  # a failed write leaves its cells for the next look
                self._cells_seen = cells
        self.moving = bool(record["tensorflow"]["memory"]) or any(
            framework and framework.get("memory") for framework in record["frameworks"].values())
        if self.moving:
            self._watch()
        return wrote

    def _watch(self) -> None:
        """Start the watch (once): every `MEMORY_SECONDS` it publishes the cells marked since its last
        look and, once they appear, the frameworks' memory figures."""
        if self.watching is None and not self._stopped.is_set():
            self.watching = threading.Thread(target=self._watch_loop, name="tfgpu_magic-memory", daemon=True)
            self.watching.start()

    def before_cell(self, info: Any = None) -> None:
        """Before each cell (IPython's `pre_run_cell`): mark it started, in memory (a clock read and an
        append: no file, no NVML). This cell's In [n]: its input is stored after `pre_run_cell` (IPython 8.0
        to 9.18), while `execution_count` is already the next cell's in IPython 9.18 (not in 9.0)."""
        stored = getattr(info, "store_history", True)
        inputs = getattr(getattr(self.shell, "history_manager", None), "input_hist_parsed", None)
        count = len(inputs) if stored and isinstance(inputs, list) else None
        self.cells.append((count if isinstance(count, int) else None, time.time(), None))
        if self.watching is None:
            self._watch()

    def after_cell(self, result: Any = None, *_: Any) -> bool:
        """After each cell (IPython's `post_run_cell`): mark it ended (in memory, as `before_cell`), and
        publish if JAX, Keras or PyTorch was imported or started in it (they tell nobody); True when it
        wrote."""
        if self.cells and self.cells[-1][2] is None:
            count, start, _ = self.cells[-1]
            exact = getattr(result, "execution_count", None)  # the cell's own In [n], whatever the version
            self.cells[-1] = (exact if isinstance(exact, int) else count, start, time.time())
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
        if self.shell_events is None:
            return
        for event, callback in (("pre_run_cell", self.before_cell), ("post_run_cell", self.after_cell)):
            if callback in self.shell_events.callbacks[event]:
                self.shell_events.unregister(event, callback)

    def _watch_loop(self) -> None:
        """A tick every `MEMORY_SECONDS` until `stop`. A failed tick (an NVML hiccup, a state read mid-change)
        is logged once on the kernel's log, not in a cell's output, and the next tick tries again: ending
        here would leave the server without this kernel's figures and cells for good. Failures in a row wait
        longer each time, up to `FAILED_TICKS_WAIT` ticks, so a lasting one costs little."""
        failures = 0
        while not self._stopped.wait(MEMORY_SECONDS * min(1 << failures, FAILED_TICKS_WAIT)):
            try:
                self._tick()
                failures = 0
            except Exception:  # noqa: BLE001 (the watch must outlive what it reads)
                failures = min(failures + 1, FAILED_TICKS_WAIT.bit_length())
                self.log.log(logging.DEBUG if self._tick_failed else logging.WARNING,
                             "tfgpu_magic: publishing this kernel's state failed; trying again", exc_info=True)
                self._tick_failed = True

    def _tick(self) -> bool:
        """A full look where a cell started or ended since the last, or JAX, PyTorch or Keras moved on since
        the last cell's look (they tell nobody); else, while figures move, only them; else nothing."""
        if tuple(self.cells) == self._cells_seen:
            if not self.moving:
                return False  # nothing to look at
            moment = self.source.frameworks_moment()
            if self._moment is None or moment == self._moment:
                return self.changed(full=False)
            self._moment = moment
        return self.changed()

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
    publisher.log = getattr(shell.kernel, "log", None) or publisher.log  # the kernel's log: the server's terminal
    source.subscribe(publisher.changed)
    events.subscribe(changed)  # TensorFlow imported or initialized (`tf.initcell` records only after this)
    if hasattr(shell, "events"):
        shell.events.register("pre_run_cell", publisher.before_cell)
        shell.events.register("post_run_cell", publisher.after_cell)
        publisher.shell, publisher.shell_events = shell, shell.events
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
