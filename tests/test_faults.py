"""Faults and hostile state: each test makes one attack as a user or another process would, and
checks what must hold afterwards.

- A crash or hang inside `import tensorflow` at `loglevel error` (`os.abort()`, `os._exit(3)`, a
  segfault under `-X dev`, a hang killed from outside): the import's error lines and its own last
  words reach the real stderr, filtered line by line; a child the import started still reaches it
  after the importing process is gone. The `tensorflow` package is a fake (tests/faults_support.py)
  that writes log lines and ends as told, in a fresh process.
- Reservations naming a pid that cannot be a process, or a zombie: dead, and the launch picks as if
  they were not there.
- A kernel whose connection-file name is as long as a file name can be: the profile's later startup
  files still run.
- A pending policy stored for one kernel is taken by no other: not by a connection file of the same
  name in another folder, not by a key that a file name would spell the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_nvml import UUIDS, FakeNvml, four_gpus
from faults_support import LINES_DURING_IMPORT, fake_tensorflow
from kernels import quiet_env
from servers import isolated_jupyter, standalone_kernel, wait_until

from tfgpu_magic.gpus import processes, reservations
from tfgpu_magic.gpus.inventory import Inventory, Nvml, read_inventory
from tfgpu_magic.jupyter import persist
from tfgpu_magic.jupyter.startup import kernel_key
from tfgpu_magic.language.policy import Policy

TIMEOUT = 60
IMPORTING = "from tfgpu_magic import configure\nconfigure('loglevel error')\nimport tensorflow\nprint('imported')\n"
DROPPED, *KEPT = LINES_DURING_IMPORT.decode().splitlines()


# ----- a crash or a hang inside `import tensorflow` -----------------------------------------------------
def importing(tmp_path: Path, ending: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """A fresh process at `loglevel error` importing the fake TensorFlow that ends as `ending`."""
    env = quiet_env(PYTHONPATH=str(fake_tensorflow(tmp_path / "fake", ending)))
    return subprocess.run([sys.executable, *flags, "-c", IMPORTING], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)


@pytest.mark.parametrize(("ending", "flags", "returncode"), [
    ("abort", (), -signal.SIGABRT),
    ("exit", (), 3),
    ("segfault", ("-X", "dev"), -signal.SIGSEGV),
], ids=["abort", "exit", "segfault"])
def test_a_crash_inside_the_import_keeps_its_last_words(tmp_path: Path, ending: str, flags: tuple[str, ...],
                                                        returncode: int) -> None:
    done = importing(tmp_path, ending, *flags)
    assert done.returncode == returncode, done.stderr
    lines = done.stderr.splitlines()
    assert [line for line in lines if line in KEPT] == KEPT and DROPPED not in lines
    if ending == "segfault":  # faulthandler's report, written to fd 2 as the process dies
        assert "Fatal Python error: Segmentation fault" in lines


def test_a_hanging_import_shows_its_lines_before_it_is_killed(tmp_path: Path) -> None:
    hanging = tmp_path / "hanging"
    env = quiet_env(PYTHONPATH=str(fake_tensorflow(tmp_path / "fake", "hang")), FAKE_TF_HANGING=str(hanging))
    with open(tmp_path / "stderr", "w+b") as stderr:
        process = subprocess.Popen([sys.executable, "-c", IMPORTING], env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_until(hanging.exists, TIMEOUT, "the import hanging")
            shown = wait_until(lambda: all(line.encode() in (tmp_path / "stderr").read_bytes() for line in KEPT),
                               TIMEOUT, "the import's lines on stderr while it hangs")
        finally:
            process.kill()
            process.wait(TIMEOUT)
    assert shown and DROPPED.encode() not in (tmp_path / "stderr").read_bytes()


def test_a_child_started_during_the_import_still_reaches_stderr_afterwards(tmp_path: Path) -> None:
    """The child writes half a second after the import, when the importing process has exited."""
    done = importing(tmp_path, "child")
    assert done.returncode == 0 and done.stdout == "imported\n", done.stderr
    lines = done.stderr.splitlines()
    assert [line for line in lines if line in KEPT] == KEPT and DROPPED not in lines
    assert any(line.endswith("child.cc:1] the child, after the import") for line in lines), lines


# ----- pids that are not running processes --------------------------------------------------------------
def _inventory() -> Inventory:
    return read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))


@pytest.mark.parametrize("pid", [2**63, 2**31, -5, 0, True, 4_194_304])
def test_a_pid_that_cannot_be_a_process_is_dead(tmp_path: Path, pid: int) -> None:
    """A reservation naming it is ignored (no OverflowError), the next pick is the freest card, and
    `who` still lists what it lists."""
    from tfgpu_magic.holders import who

    assert processes.alive(pid) is False
    record = {"format": reservations.FORMAT, "kernel_id": "odd", "gpus": [UUIDS[2]], "why": "",
              "launcher_pid": pid, "kernel_pid": None, "created": time.time()}
    path = reservations.path_for("odd", tmp_path)
    path.write_text(json.dumps(record))
    path.chmod(0o600)
    assert reservations.current(tmp_path) == []
    assert reservations.reserve("k1", 1, _inventory(), tmp_path).gpus == (UUIDS[2],)
    assert all(not row.placed for row in who(Inventory(error="no NVML here"), tmp_path))


def _state(pid: int) -> str:
    """The state letter in /proc/PID/stat (read here, not through the code under test)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_killed_kernel_not_yet_reaped_is_dead(tmp_path: Path) -> None:
    """A zombie (state Z: killed, its launcher has not waited for it) holds no GPU: the next launch
    gets the freest card again."""
    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        first = reservations.reserve("k1", 1, _inventory(), tmp_path)
        reservations.set_kernel_pid(first, kernel.pid)
        assert [r.kernel_id for r in reservations.current(tmp_path)] == ["k1"]
        os.kill(kernel.pid, signal.SIGKILL)
        wait_until(lambda: _state(kernel.pid) == "Z", TIMEOUT, "the kernel a zombie")
        assert processes.alive(kernel.pid) is False
        assert reservations.current(tmp_path) == []
        assert reservations.reserve("k2", 1, _inventory(), tmp_path).gpus == first.gpus
    finally:
        kernel.kill()
        kernel.wait(TIMEOUT)


# ----- startup files ------------------------------------------------------------------------------------
def test_a_connection_file_name_as_long_as_a_name_can_be_stops_no_startup_file() -> None:
    """`kernel-<243 characters>.json` with a pending file in the runtime dir: the pending file's name
    would be too long for the file system; the user's own startup file after ours still runs."""
    with isolated_jupyter("tfgpu-longname-") as env:
        persist.set_pending_startup(env.profile_dir)
        (env.profile_dir / "startup" / "10-user.py").write_text("USER_STARTUP_RAN = True\n", encoding="utf-8")
        persist.store_pending("another-kernel", Policy(cpu_devices=2), directory=env.runtime_dir)
        long_name = env.runtime_dir / f"kernel-{'a' * 243}.json"
        with standalone_kernel(env, connection_file=long_name) as kernel:
            assert kernel.evaluate("USER_STARTUP_RAN") is True
            first = kernel.ok("pass").output
        logs = "".join(path.read_text(errors="replace") for path in env.root.glob("kernel-*.log"))
    assert "Traceback" not in first and "Unknown error in handling startup files" not in logs, logs[-2000:]


# ----- a pending policy goes to its own kernel only ---------------------------------------------------
def test_a_pending_policy_goes_only_to_the_kernel_it_was_stored_for() -> None:
    """Stored for a/kernel-shared.json: a kernel on b/kernel-shared.json (same key `shared`) starts
    without it and leaves it; a kernel on a/kernel-shared.json then gets it."""
    with isolated_jupyter("tfgpu-pending-owner-") as env:
        persist.set_pending_startup(env.profile_dir)
        a, b = (env.root / folder / "kernel-shared.json" for folder in ("a", "b"))
        for path in (a, b):
            path.parent.mkdir()
        a.touch()  # as if kernel a were running: a pending file whose connection file is gone is cleaned away
        assert kernel_key(a) == kernel_key(b)
        stored = persist.store_pending(kernel_key(a), Policy(cpu_devices=2), connection_file=a,
                                       directory=env.runtime_dir)
        policy = "__import__('tfgpu_magic').get_controller().policy.to_dict()"
        with standalone_kernel(env, connection_file=b) as kernel:
            kernel.ok("%load_ext tfgpu_magic")
            assert kernel.evaluate(policy) == Policy().to_dict()
        assert stored.exists()
        with standalone_kernel(env, connection_file=a) as kernel:
            assert kernel.evaluate(policy) == Policy(cpu_devices=2).to_dict()
        assert not stored.exists()


def test_keys_a_file_name_spells_alike_get_pending_files_of_their_own(tmp_path: Path) -> None:
    """`kernel-a b.json` and `kernel-a_b.json`: both stored, each taken by its own kernel only."""
    files = [tmp_path / "kernel-a b.json", tmp_path / "kernel-a_b.json"]
    for path in files:
        path.touch()  # both kernels running
    keys = [kernel_key(path) for path in files]
    for count, (key, path) in enumerate(zip(keys, files), start=2):
        persist.store_pending(key, Policy(cpu_devices=count), connection_file=path, directory=tmp_path)
    assert len(list(tmp_path.glob(f"{persist.PENDING_PREFIX}*"))) == 2
    assert persist.take_pending(keys[1], tmp_path, connection_file=files[0]) is None
    assert persist.take_pending(keys[1], tmp_path, connection_file=files[1]) == Policy(cpu_devices=3)
    assert persist.take_pending(keys[0], tmp_path, connection_file=files[0]) == Policy(cpu_devices=2)
