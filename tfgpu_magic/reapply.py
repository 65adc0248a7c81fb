"""`python -m tfgpu_magic.reapply CONNECTION_FILE OLD_PID`: re-apply the policy in a restarted kernel.

Started detached by `%tfgpu restart --yes`. Waits for the old kernel process to go, connects to the
same connection file, and runs `%load_ext tfgpu_magic` silently in the new kernel; loading takes the
pending policy stored for this kernel. Gives up after `DEADLINE` seconds, and never outlives that.
"""

from __future__ import annotations

import os
import sys
import time

DEADLINE = 60.0
LOAD = "get_ipython().run_line_magic('load_ext', 'tfgpu_magic')"


def pid_alive(pid: int) -> bool:
    """True while process `pid` exists (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def reapply(connection_file: str, old_pid: int, deadline: float = DEADLINE) -> bool:
    """Wait for the new kernel behind `connection_file` and load the extension there."""
    from jupyter_client import BlockingKernelClient

    end = time.monotonic() + deadline
    while pid_alive(old_pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    client = BlockingKernelClient(connection_file=connection_file)
    client.load_connection_file()
    client.start_channels()
    try:
        while time.monotonic() < end:
            try:
                client.wait_for_ready(timeout=max(0.1, min(5.0, end - time.monotonic())))
                break
            except RuntimeError:
                continue
        else:
            return False
        msg_id = client.execute(LOAD, silent=True, store_history=False)
        reply = client.get_shell_msg(timeout=max(0.1, end - time.monotonic()))
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=max(0.1, end - time.monotonic()))
        return reply["content"].get("status") == "ok"
    except Exception:  # noqa: BLE001  (queue.Empty, zmq errors: give up quietly, the user can rerun)
        return False
    finally:
        client.stop_channels()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m tfgpu_magic.reapply CONNECTION_FILE OLD_PID", file=sys.stderr)
        return 2
    return 0 if reapply(argv[0], int(argv[1])) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
