"""Runs inside a Slurm job, just before the kernel: binds the kernel where Slurm put it and says where.

`python -m tfgpu_magic.jupyter.slurm_job CONNECTION_FILE FOLDER -- KERNEL_ARGV...` (the batch script
that `slurm_provisioner` submits). The server's connection file names the server's own interface;
the kernel must listen on this node's. So, on the node:

1. the node's address: the source address of the route to the submitting host (`SLURM_SUBMIT_HOST`),
   or, where that is this very host (a loopback route), its first public address
   (`jupyter_client.localinterfaces.public_ips`);
2. the ports: the server's where they are free here, fresh ones otherwise;
3. the kernel's own connection file, `FOLDER/<the server file's name>` (same key; the name is kept:
   the kernel finds its id in it), and the address record `FOLDER/address.json` (job id, ip, ports,
   host name, pid; no key), both written atomically (the folder sits beside the server's connection
   file, on the filesystem the login and compute nodes share);
4. `exec` of the kernel's argv with the connection file replaced by the job's, in this same process
   (the job's batch step is the kernel, so Slurm's signals reach it). Where the job waited in the queue
   for `QUEUE_NOTE_AFTER` seconds or more, the kernel's first cell says so (`LAUNCH_WARNING_ENV`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from ..envvars import SLURM_JOB_ID, SLURM_SUBMIT_HOST, TFGPU_MAGIC_SLURM_SUBMITTED
from ..safefile import read_json, write_atomic
from .startup import LAUNCH_WARNING_ENV

ADDRESS_FILE = "address.json"
PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
CONNECTION_BYTES = 64 * 1024
QUEUE_NOTE_AFTER = 5.0
"""Seconds of waiting in the queue from which the kernel's first cell mentions it."""


def node_address(environ: Mapping[str, str]) -> str:
    """This node's address for the kernel (see the module docstring, step 1)."""
    submit_host = environ.get(SLURM_SUBMIT_HOST)
    if submit_host:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((submit_host, 9))  # a datagram socket's connect sends nothing
                source = probe.getsockname()[0]
            if not ipaddress.ip_address(source).is_loopback:
                return source
        except (OSError, ValueError):
            pass  # no route, an unknown name: the public address below
    from jupyter_client.localinterfaces import public_ips

    found = public_ips()
    return found[0] if found else "127.0.0.1"


def free_here(ip: str, port: int) -> bool:
    """Whether TCP `port` can be bound on `ip` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True


def fresh_port(ip: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def job_connection(info: Mapping[str, Any], ip: str) -> dict[str, Any]:
    """The server's connection info moved to `ip`: its ports kept where free here (step 2)."""
    if info.get("transport", "tcp") != "tcp":
        raise SystemExit(f"slurm_job: the connection file's transport is {info.get('transport')!r}; "
                         "a kernel in a Slurm job needs tcp")
    moved = {**info, "ip": ip}
    taken: set[int] = set()
    for name in PORT_NAMES:
        port = info.get(name)
        if not (isinstance(port, int) and 0 < port < 65536 and port not in taken and free_here(ip, port)):
            port = fresh_port(ip)
        moved[name] = port
        taken.add(port)
    return moved


def queue_note(environ: Mapping[str, str], now: float) -> str | None:
    """The first cell's line about the queue, or None when the wait was short."""
    try:
        waited = now - float(environ.get(TFGPU_MAGIC_SLURM_SUBMITTED, ""))
    except ValueError:
        return None
    if waited < QUEUE_NOTE_AFTER:
        return None
    job = environ.get(SLURM_JOB_ID, "?")
    return f"this kernel waited {waited:.0f} s in Slurm's queue (job {job} on {socket.gethostname()})"


def main(argv: list[str]) -> None:
    """Steps 1-4 of the module docstring; `SystemExit` with one line when the arguments are wrong."""
    if len(argv) < 4 or argv[2] != "--":
        raise SystemExit("usage: python -m tfgpu_magic.jupyter.slurm_job CONNECTION_FILE FOLDER -- KERNEL_ARGV...")
    server_file, folder, kernel_argv = argv[0], Path(argv[1]), argv[3:]
    info = read_json(Path(server_file), CONNECTION_BYTES)
    if not isinstance(info, dict):
        raise SystemExit(f"slurm_job: {server_file} is not a connection file")
    ip = node_address(os.environ)
    moved = job_connection(info, ip)
    own_file = folder / Path(server_file).name
    write_atomic(own_file, json.dumps(moved, indent=1), mode=0o600)
    record = {"job_id": os.environ.get(SLURM_JOB_ID), "ip": ip, "hostname": socket.gethostname(),
              "pid": os.getpid(), **{name: moved[name] for name in PORT_NAMES}}
    write_atomic(folder / ADDRESS_FILE, json.dumps(record), mode=0o600)
    note = queue_note(os.environ, time.time())
    if note:
        earlier = os.environ.get(LAUNCH_WARNING_ENV, "").strip()
        os.environ[LAUNCH_WARNING_ENV] = f"{earlier}; {note}" if earlier else note
    command = [str(own_file) if arg == server_file else arg for arg in kernel_argv]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
