#!/usr/bin/env python
"""Restart round trip as a client sees it: a plain server restart vs `%tfgpu restart --yes`.

Under one real `jupyter_server` (temp dirs, token; tests/servers.py), two kernels, each with one client
that stays connected across restarts (as a front end's connection does; the kernel keeps its ports):
- plain: `POST /api/kernels/{id}/restart`;
- apply: the cell `%tfgpu restart --yes` (extension loaded, policy `split cpu 2`).
From that moment the client sends the same small silent cell every `TRY_INTERVAL` until one of these
tries is answered by the new kernel (another pid) with, on the apply side, the policy in force. A try the
old kernel answers `aborted`, or one lost as it dies, costs nothing: the next is already on its way. What
is timed is what a user who runs the next cell waits. Neither side imports TensorFlow. Samples are taken
in pairs, alternating which side goes first, after one untimed pair (first-time setup); the figure
is the median. Kernels and server cache bytecode as a user's install has it (`bytecode.py`).

`python benchmarks/bench_restart.py [--repeat N] [--no-pyc-cache]`; exit status 1 if the ratio misses
its target.
"""

from __future__ import annotations

import argparse
import ast
import queue
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bytecode import with_bytecode_cache  # noqa: E402
from pairs import DEFAULT_REPEAT, RESTART_PAIRS_FACTOR  # noqa: E402
from servers import (  # noqa: E402  (tests/ is not a package)
    JupyterServer,
    KernelConnection,
    isolated_jupyter,
    running_server,
)

TARGET = 1.1
"""Restart-and-apply may take at most this many times a plain restart."""
TIMEOUT = 60.0
TRY_INTERVAL = 0.02
"""Seconds between two tries (each a silent cell that evaluates one expression)."""
PLAIN_PROBE = "__import__('os').getpid()"
APPLY_PROBE = (
    "(__import__('os').getpid(), 'tfgpu_magic' in get_ipython().extension_manager.loaded"
    " and __import__('tfgpu_magic').current_policy().cpu_devices == 2)"
)


def value_of(reply: dict) -> object | None:
    """The value a `user_expressions` reply carries; None for an aborted or failed try."""
    value = reply["content"].get("user_expressions", {}).get("value", {})
    if reply["content"]["status"] != "ok" or value.get("status") != "ok":
        return None
    return ast.literal_eval(value["data"]["text/plain"])


def until_new_kernel(kernel: KernelConnection, expression: str, done: Callable[[object], bool], started: float) -> float:
    """Send `expression` every `TRY_INTERVAL` until a reply to any of these tries satisfies `done`;
    seconds since `started`. A try the old kernel aborts, or one lost as it dies, costs nothing:
    the next one is already on its way."""
    client = kernel.client
    sent: set[str] = set()
    next_try = 0.0
    while (now := time.perf_counter()) - started < TIMEOUT:
        if now >= next_try:
            sent.add(client.execute("", silent=True, user_expressions={"value": expression}))
            next_try = now + TRY_INTERVAL
        try:
            reply = client.get_shell_msg(timeout=max(0.0, next_try - time.perf_counter()))
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") in sent:
            value = value_of(reply)
            if value is not None and done(value):
                return time.perf_counter() - started
    raise TimeoutError(f"no kernel answered as wanted within {TIMEOUT} s")


def current_pid(kernel: KernelConnection) -> int:
    """The kernel's pid, through the same tries as the timing (no IOPub: a kept client's subscription
    may still be catching up after a restart)."""
    pid: list[int] = []
    until_new_kernel(kernel, PLAIN_PROBE, lambda value: bool(pid.append(value) or True), time.perf_counter())
    return pid[0]


def plain_restart(server: JupyterServer, kernel: KernelConnection) -> float:
    """Seconds from the REST restart until the new kernel answers a cell."""
    old_pid = current_pid(kernel)
    started = time.perf_counter()
    server.restart_kernel(kernel.kernel_id)
    return until_new_kernel(kernel, PLAIN_PROBE, lambda pid: pid != old_pid, started)


def restart_and_apply(kernel: KernelConnection) -> float:
    """Seconds from sending `%tfgpu restart --yes` until the new kernel answers a cell with the
    policy in force."""
    old_pid = current_pid(kernel)
    started = time.perf_counter()
    kernel.client.execute("%tfgpu restart --yes")
    return until_new_kernel(kernel, APPLY_PROBE, lambda value: value[0] != old_pid and value[1], started)


def restart_roundtrip(repeat: int, pyc_cache: bool = True) -> dict:
    """Median seconds of both restarts over `repeat` pairs, their ratio, the target and whether it is
    met; `pyc_cache`: see `bytecode.py`."""
    samples: dict[str, list[float]] = {"plain_s": [], "apply_s": []}
    with isolated_jupyter("tfgpu-bench-") as env:
        env.environ = with_bytecode_cache(env.environ, pyc_cache)
        with running_server(env) as server, server.kernel() as plain, server.kernel() as applying:
            applying.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2")
            plain_restart(server, plain)  # untimed: fills the bytecode cache, first-time setup
            restart_and_apply(applying)
            for index in range(repeat):
                order = ("plain", "apply") if index % 2 == 0 else ("apply", "plain")
                for side in order:
                    if side == "plain":
                        samples["plain_s"].append(plain_restart(server, plain))
                    else:
                        samples["apply_s"].append(restart_and_apply(applying))
    result: dict = {name: statistics.median(values) for name, values in samples.items()}
    result["ratio"] = result["apply_s"] / result["plain_s"]
    result.update(target=TARGET, ok=result["ratio"] <= TARGET, repeat=repeat, samples=samples)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pairs = DEFAULT_REPEAT * RESTART_PAIRS_FACTOR
    parser.add_argument("--repeat", type=int, default=pairs, help=f"pairs of samples (default {pairs}, as `make bench`)")
    parser.add_argument("--no-pyc-cache", dest="pyc_cache", action="store_false",
                        help="kernels keep the environment's bytecode setting")
    args = parser.parse_args(argv)
    result = restart_roundtrip(args.repeat, args.pyc_cache)
    print(f"plain server restart     {result['plain_s']:.3f} s (median of {args.repeat})")
    print(f"restart and apply        {result['apply_s']:.3f} s (median of {args.repeat})")
    verdict = "met" if result["ok"] else "MISSED"
    print(f"ratio                    {result['ratio']:.2f} (target <= {TARGET}: {verdict})")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
