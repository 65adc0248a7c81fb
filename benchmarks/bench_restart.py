#!/usr/bin/env python
"""Restart round trip: a plain server restart vs `%tfgpu restart --yes` (restart and re-apply).

Under one real `jupyter_server` (temp dirs, token; tests/servers.py), two kernels:
- plain: `POST /api/kernels/{id}/restart`, until the new kernel answers a cell;
- apply: the cell `%tfgpu restart --yes` (extension loaded, policy `split cpu 2`), until the new
  kernel answers a cell and has the policy (taken from the pending file, import hook armed).
Neither side imports TensorFlow. Samples are taken in pairs, alternating which side goes first;
the figure is the median. The new kernel is noticed the same way on both sides (old PID gone, a
client connects to the same connection file), and the apply side watches the pending file rather
than polling the kernel, which would hold the re-apply back (see tests/test_restart.py).

`python benchmarks/bench_restart.py [--repeat N]`; exit status 1 if the ratio misses its target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from servers import (  # noqa: E402  (tests/ is not a package)
    JupyterServer,
    KernelConnection,
    await_new_kernel,
    isolated_jupyter,
    running_server,
    wait_until,
)

TARGET = 1.3
"""Restart-and-apply may take at most this many times a plain restart."""
TIMEOUT = 60.0
POLICY_IN_FORCE = (
    "'tfgpu_magic' in get_ipython().extension_manager.loaded"
    " and __import__('tfgpu_magic').current_policy().cpu_devices == 2"
    " and __import__('tfgpu_magic.tf.importhook').tf.importhook.is_armed()"
)


def plain_restart(server: JupyterServer, kernel: KernelConnection) -> tuple[float, KernelConnection]:
    """Seconds from the REST restart until the new kernel answers a cell; and that kernel."""
    old_pid = kernel.pid()
    started = time.perf_counter()
    server.restart_kernel(kernel.kernel_id)
    new = await_new_kernel(kernel, old_pid, TIMEOUT)
    new_pid = new.pid()  # the first cell answered
    elapsed = time.perf_counter() - started
    assert new_pid != old_pid
    return elapsed, new


def restart_and_apply(kernel: KernelConnection) -> tuple[float, KernelConnection]:
    """Seconds from sending `%tfgpu restart --yes` until the new kernel answers a cell with the
    policy in force; and that kernel."""
    old_pid = kernel.pid()
    pending = kernel.env.runtime_dir / f"tfgpu-pending-{kernel.kernel_id}.json"
    started = time.perf_counter()
    kernel.ok("%tfgpu restart --yes")
    wait_until(lambda: not pending.exists(), TIMEOUT, "pending policy taken", interval=0.005)
    new = await_new_kernel(kernel, old_pid, TIMEOUT)
    wait_until(lambda: new.evaluate(POLICY_IN_FORCE, timeout=10), 10, "policy in force", interval=0.005)
    elapsed = time.perf_counter() - started
    assert new.pid() != old_pid
    return elapsed, new


def restart_roundtrip(repeat: int = 5) -> dict:
    """Median seconds of both restarts over `repeat` pairs, their ratio, the target and whether it is met."""
    samples: dict[str, list[float]] = {"plain_s": [], "apply_s": []}
    with isolated_jupyter("tfgpu-bench-") as env, running_server(env) as server:
        with server.kernel() as plain, server.kernel() as applying:
            applying.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2")
            for index in range(repeat):
                order = ("plain", "apply") if index % 2 == 0 else ("apply", "plain")
                for side in order:
                    if side == "plain":
                        elapsed, plain = plain_restart(server, plain)
                        samples["plain_s"].append(elapsed)
                    else:
                        elapsed, applying = restart_and_apply(applying)
                        samples["apply_s"].append(elapsed)
    result: dict = {name: statistics.median(values) for name, values in samples.items()}
    result["ratio"] = result["apply_s"] / result["plain_s"]
    result.update(target=TARGET, ok=result["ratio"] <= TARGET, repeat=repeat, samples=samples)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="pairs of samples (default 5)")
    args = parser.parse_args(argv)
    result = restart_roundtrip(args.repeat)
    print(f"plain server restart     {result['plain_s']:.3f} s (median of {args.repeat})")
    print(f"restart and apply        {result['apply_s']:.3f} s (median of {args.repeat})")
    verdict = "met" if result["ok"] else "MISSED"
    print(f"ratio                    {result['ratio']:.2f} (target <= {TARGET}: {verdict})")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
