"""Helpers for the fault and hostile-state tests (tests/test_faults.py, tests/test_provisioner.py).

- Run as `python -m faults_support ARGS…` (`SERVER_APP`, for `servers.running_server(env, app=…)`):
  a Jupyter server whose kernel provisioner sees tests/fake_nvml.py's four cards, so a `visible
  auto` launch reaches the reservation lock inside the server process (which it waits for at most
  `SERVER_LOCK_WAIT` seconds). `server_env` puts this directory on the server's PYTHONPATH.
- `hold_lock` holds a file's `flock` from this process, as a stuck launcher would.
- `bounded` runs a call that might hang (a FIFO, a held lock) and fails the test if it does.
- `opened_by` tells whether a process has a file open (it reached the code that locks it).
- `fake_tensorflow` writes a `tensorflow` package whose import writes log lines to fd 2 and then ends
  the way the test says (a crash, a hang, a child that writes later).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

TESTS = Path(__file__).resolve().parent
SERVER_APP = "faults_support"
SERVER_LOCK_WAIT = 2.0
"""The server's bounded wait for the reservation lock: shorter than the product's, to keep tests quick."""


def server_env(environ: dict[str, str]) -> None:
    """Let a server started from `environ` import this module and tests/fake_nvml.py."""
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), environ.get("PYTHONPATH")]))


@contextlib.contextmanager
def hold_lock(path: Path) -> Iterator[None]:
    """An exclusive `flock` on `path` (created if missing) until the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def bounded(call: Callable[[], Any], seconds: float) -> Any:
    """`call()` in a thread; fails if it takes longer than `seconds` (it would hang on a FIFO or a held lock)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # noqa: BLE001 (reported below)
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def opened_by(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open (its /proc/PID/fd links)."""
    folder = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        for fd in folder.iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) == str(path):
                    return True
    return False


LINES_DURING_IMPORT = (
    b"I0000 00:00:1.5 7 port.cc:153] chatter below the level\n"
    b"E0000 00:00:1.5 7 x.cc:1] an error as the import fails\n"
    b"the import's own last words\n"
)
"""What the fake TensorFlow writes to fd 2 before it ends: at `loglevel error` the first line is
dropped, the other two must reach the real stderr."""
ENDINGS = {
    "abort": "os.abort()",
    "exit": "os._exit(3)",
    "segfault": "import ctypes\nctypes.string_at(0)",
    "hang": "open(os.environ['FAKE_TF_HANGING'], 'w').close()\ntime.sleep(600)",
    "child": (
        "import subprocess\n"
        "subprocess.Popen([sys.executable, '-c', 'import os, time; time.sleep(0.5); "
        "os.write(2, b\"I0000 00:00:1.5 8 child.cc:1] the child, after the import\\\\n\")'])"
    ),
}
"""How the fake import ends: `os.abort()`, `os._exit(3)`, a segfault, a hang (after touching the
file `FAKE_TF_HANGING` names), or normally after starting a child that writes to fd 2 half a second
later, after the importing process has exited."""


def fake_tensorflow(root: Path, ending: str) -> Path:
    """A `tensorflow` package under `root` that writes `LINES_DURING_IMPORT` and ends as
    `ENDINGS[ending]` says; `root` (to put on PYTHONPATH)."""
    package = root / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"import os, sys, time\nos.write(2, {LINES_DURING_IMPORT!r})\n{ENDINGS[ending]}\n", encoding="utf-8")
    return root


def serve() -> None:
    """The Jupyter server of `SERVER_APP`, its provisioner on fake NVML."""
    from fake_nvml import FakeNvml, four_gpus

    from tfgpu_magic.gpus import inventory, reservations
    from tfgpu_magic.jupyter import provisioner

    nvml = inventory.Nvml(module=FakeNvml(four_gpus(this_kernel=False)))
    provisioner.read_inventory = lambda: inventory.read_inventory(nvml)
    reservations.LOCK_WAIT = SERVER_LOCK_WAIT
    from jupyter_server.serverapp import main

    sys.exit(main())


if __name__ == "__main__":
    serve()
