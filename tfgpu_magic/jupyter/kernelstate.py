"""This kernel's tfgpu state, published for the Jupyter server extension (`tfgpu_magic.serverext`).

A busy kernel answers nothing (its shell channel waits for the cell), yet during `model.fit` is when
users want to see their GPU memory and policy. So the kernel writes its state when it changes: the
policy, TensorFlow's state and the cell that initialized it, what waits for a restart. It is one
private JSON file named after the kernel id, next to the kernel's connection file (the Jupyter runtime
dir, where the server keeps them: `safefile.write_atomic`, mode 0600, through a rename, never through
a link), removed when the kernel exits; the server reads it (`serverext.gather`) whatever the kernel
is doing.

Nothing runs per cell. A write happens on a policy change (`Controller.subscribe`), at
`import tensorflow` and when the runtime is initialized (`changed()`), and only when the content
differs from the last write. Only kernels a Jupyter server started publish (connection file
`kernel-<id>.json`): nobody else would read the file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from . import persist
from ..errors import PolicyError, warn
from ..gpus.processes import server_kernel_id

if TYPE_CHECKING:
    from ..language.policy import Policy
    from ..tf.runtime import RuntimeState

FORMAT = "tfgpu_magic/kernel-state/1"
PREFIX = "tfgpu-state-"
STATE_BYTES = 64 << 10
"""Largest state file the server reads (a real one is under 2 KiB)."""
TENSORFLOW_STATES = ("not imported", "imported", "initialized")
RESTART_TITLE = "Pending, needs a restart"
"""The title of the group of changes only a restart can make, in `Controller.pending()`."""


Word = Callable[[Any], str]
"""Words one of `StateSource.pending()`'s changes (the views give it: this room renders nothing)."""


class StateSource(Protocol):
    """What is published: the controller's public surface."""

    policy: Policy

    def state(self) -> RuntimeState: ...
    def pending(self, state: RuntimeState | None = None) -> list[tuple[str, list[Any]]]: ...
    def subscribe(self, listener: Callable[[Any], None]) -> None: ...
    def unsubscribe(self, listener: Callable[[Any], None]) -> None: ...


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


def tensorflow_state(state: RuntimeState) -> str:
    """One of `TENSORFLOW_STATES`."""
    return TENSORFLOW_STATES[2 if state.initialized else 1 if state.imported else 0]


def snapshot(source: StateSource, kernel_id: str, initialized_by: str | None, word: Word) -> dict[str, Any]:
    """The record for `source` now (without the time it was written); `word` words each pending change."""
    from ..language.directives import describe_policy

    state = source.state()
    return {
        "format": FORMAT,
        "kernel_id": kernel_id,
        "pid": os.getpid(),
        "policy": source.policy.to_dict(),
        "policy_text": describe_policy(source.policy),
        "tensorflow": tensorflow_state(state),
        "tensorflow_label": state.label,
        "initialized_by": initialized_by if state.initialized else None,
        "pending": [{"title": title, "items": [word(item) for item in items]} for title, items in source.pending(state)],
    }


class Publisher:
    """Writes `source`'s state for kernel `kernel_id` to `path` whenever `changed()` finds it different."""

    def __init__(self, source: StateSource, kernel_id: str, path: Path, word: Word) -> None:
        self.source = source
        self.word = word
        self.kernel_id = kernel_id
        self.path = path
        self.last: dict[str, Any] | None = None
        self.writes = 0
        self._warned = False

    def changed(self, *_: Any) -> bool:
        """Write the state if it differs from the last write; True when it wrote. A controller
        listener (called with the controller), hence the ignored arguments."""
        record = snapshot(self.source, self.kernel_id, _initialized_by, self.word)
        if record == self.last:
            return False
        from .. import safefile

        try:
            safefile.write_atomic(self.path, json.dumps({**record, "written": time.time()}) + "\n")
        except (OSError, PolicyError) as err:
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
        self.source.unsubscribe(self.changed)
        from .. import safefile

        try:
            data = safefile.read_json(self.path, STATE_BYTES, private=True)
        except PolicyError:
            return  # not a file we can vouch for: leave it
        if isinstance(data, dict) and data.get("format") == FORMAT and data.get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)


_publisher: Publisher | None = None
_initialized_by: str | None = None
"""`tf.initcell`'s record, handed over by `changed(initialized_by=...)` when it is made."""


def start_publishing(shell: Any, source: StateSource, directory: Path | None = None, *, word: Word) -> Publisher | None:
    """Publish `source`'s state for this kernel from now on (in `directory`, by default its connection
    file's): written now, on every policy change, and on `changed()`; removed at exit. None (nothing
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

    publisher = Publisher(source, kernel_id, state_path(kernel_id, directory or connection.parent), word)
    source.subscribe(publisher.changed)
    events.subscribe(changed)  # TensorFlow imported or initialized (`tf.initcell` records only after this)
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


def changed(initialized_by: str | None = None) -> bool:
    """Something outside the policy changed (TensorFlow imported or initialized): publish if the
    state differs. `initialized_by`: the initializing cell, as `tf.initcell` recorded it. True when
    a file was written."""
    global _initialized_by
    if initialized_by is not None:
        _initialized_by = initialized_by
    return _publisher.changed() if _publisher is not None else False
