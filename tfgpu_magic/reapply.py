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
        # kernel_info answered on the shell channel means the new kernel is serving requests. (Not
        # `wait_for_ready`: it also waits for a quiet IOPub, which other clients can hold off forever.)
        _reply(client, client.kernel_info(), end)
        return _reply(client, client.execute(LOAD, silent=True, store_history=False), end)["status"] == "ok"
    except Exception:  # noqa: BLE001  (queue.Empty, zmq errors: give up quietly, the user can rerun)
        return False
    finally:
        client.stop_channels()


def _reply(client: object, msg_id: str, end: float) -> dict:
    """The content of the shell reply to `msg_id`, waiting until `end` at most (queue.Empty after)."""
    while True:
        reply = client.get_shell_msg(timeout=max(0.05, end - time.monotonic()))  # type: ignore[attr-defined]
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m tfgpu_magic.reapply CONNECTION_FILE OLD_PID", file=sys.stderr)
        return 2
    return 0 if reapply(argv[0], int(argv[1])) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
