"""A container's own pid namespace: NVML reports host pids, which must never be matched to /proc's.

The namespace is a real one, made by the test (`unshare --pid --fork --mount-proc`, which needs
root): a child Python there is pid 1, started as a kernel would be (`-f …/kernel-<id>.json`), and the
fake NVML lists pid 1 (another process on the host) and a host pid that exists nowhere here. The same
child outside the namespace, listed by its real pid, is matched as before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tfgpu_magic.gpus import processes
from tfgpu_magic.views import who as who_view

TESTS = Path(__file__).resolve().parent
KERNEL_ID = "c0ffee00-1111-2222-3333-444455556666"
HOST_PID, HOST_MIB, OWN_MIB = 31314, 5000, 7000

CHILD = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from fake_nvml import FakeGpu, FakeNvml, UUIDS
    from tfgpu_magic import holders
    from tfgpu_magic.gpus import inventory, processes
    from tfgpu_magic.views import who as who_view

    own, host_pid, host_mib, own_mib = (int(arg) for arg in sys.argv[1:5])
    pid = os.getpid() if own else 1  # in the namespace the child is pid 1, and NVML's 1 is the host's
    gpus = [FakeGpu(UUIDS[0], used_mib=host_mib + own_mib, processes=[(pid, own_mib), (host_pid, host_mib)])]
    found = inventory.read_inventory(inventory.Nvml(module=FakeNvml(gpus)))
    runtime = Path(sys.argv[5])
    rows = holders.who(found, runtime)
    print(json.dumps({
        "pid": os.getpid(),
        "foreign": processes.foreign_pid_namespace(),
        "is_self": [proc.is_self for proc in found.gpus[0].processes],
        "self_mib": inventory.self_mib(found.gpus[0]),
        "rows": [row.as_dict() for row in rows],
        "text": who_view.render(rows, found),
    }))
""")


def unshare_works() -> bool:
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def run_child(tmp_path: Path, own: bool, namespace: bool) -> dict[str, Any]:
    """The child's findings; `own`: NVML lists the child by its own pid (else by 1, and it runs in a
    new pid namespace where it is 1)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    runtime = tmp_path / "runtime"
    runtime.mkdir(exist_ok=True)
    argv = [sys.executable, str(script), str(int(own)), str(HOST_PID), str(HOST_MIB), str(OWN_MIB), str(runtime),
            "-f", str(tmp_path / f"kernel-{KERNEL_ID}.json")]  # a kernel's command line: `who` lists it as one
    if namespace:
        argv = ["unshare", "--pid", "--fork", "--mount-proc", *argv]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "JUPYTER_RUNTIME_DIR": str(runtime)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(not unshare_works(), reason="needs root and a working `unshare --pid --fork --mount-proc`")
def test_in_a_pid_namespace_nvml_pids_are_never_matched(tmp_path: Path) -> None:
    said = run_child(tmp_path, own=False, namespace=True)
    assert said["pid"] == 1 and said["foreign"] is True
    assert said["is_self"] == [None, None] and said["self_mib"] is None  # NVML's 1 is not us
    host_rows = [row for row in said["rows"] if row["host_pid"]]
    assert [(row["pid"], row["gpu_memory"]) for row in host_rows] == [
        (1, {"0": OWN_MIB << 20}), (HOST_PID, {"0": HOST_MIB << 20})]
    for row in host_rows:
        assert [row[key] for key in ("user", "kernel_id", "notebook", "this", "mine")] == [None, None, None, False, False]
    [kernel] = [row for row in said["rows"] if not row["host_pid"]]
    assert (kernel["pid"], kernel["this"], kernel["kernel_id"], kernel["gpu_memory"]) == (1, True, KERNEL_ID, {})
    text = said["text"]
    assert text.count(who_view.HOST_PIDS) == 1 and "--pid=host" in text and "hostPID: true" in text
    assert "  host pid 1 · 6.8 GiB" in text.splitlines() and f"  host pid {HOST_PID} · 4.9 GiB" in text.splitlines()
    [this] = [line for line in text.splitlines() if line.endswith("← this kernel")]
    assert this.startswith("  pid 1 · ") and f"kernel {KERNEL_ID[:8]}" in this and "GiB" not in this
    assert "Your kernels (their TensorFlow reports no GPU memory):" in text


@pytest.mark.skipif(processes.foreign_pid_namespace() is not False,
                    reason="this test process itself runs in a pid namespace other than the host's")
def test_in_the_hosts_namespace_the_same_child_is_matched(tmp_path: Path) -> None:
    said = run_child(tmp_path, own=True, namespace=False)
    assert said["foreign"] is False and said["is_self"] == [True, False] and said["self_mib"] == OWN_MIB
    assert not any(row["host_pid"] for row in said["rows"])
    me = next(row for row in said["rows"] if row["pid"] == said["pid"])
    assert me["this"] and me["kernel_id"] == KERNEL_ID and me["gpu_memory"] == {"0": OWN_MIB << 20}
    text = said["text"]
    assert who_view.HOST_PIDS not in text and "host pid" not in text
    [this] = [line for line in text.splitlines() if line.endswith("← this kernel")]
    assert f"pid {said['pid']} · " in this and "6.8 GiB" in this
