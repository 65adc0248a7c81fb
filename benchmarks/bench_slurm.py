#!/usr/bin/env python
"""Kernel start through Slurm vs a local kernel, as a client sees it, on the tests' private Slurm.

Under one real `jupyter_server` (temp dirs, token; tests/servers.py) that submits to a private one-node
Slurm (tests/slurm_cluster.py: its own munged, slurmctld and slurmd, as root), two kernelspecs that
differ only in where the kernel runs: `local` (`tfgpu-provisioner`, a child of the server) and `slurm`
(`tfgpu-slurm-provisioner`, `--gres=gpu:1`: a batch job on the node). Both run the same argv (ipykernel
with the extension, through the fake-NVML wrapper). A sample is the seconds from `POST /api/kernels`
to the kernel's first `kernel_info` reply; samples alternate which side goes first, after one untimed
pair; figures are medians. After the last sample the server is stopped (SIGTERM) and the jobs left in
the queue are counted: the figure must be 0.

`python benchmarks/bench_slurm.py [--repeat N]`; exit status 1 if a job outlives the server. Needs
Debian's slurm-wlm and munge, and root.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from servers import JupyterServer, isolated_jupyter, running_server, stop_pids  # noqa: E402  (tests/ is not a package)
from slurm_cluster import missing_slurm, private_cluster  # noqa: E402

from tfgpu_magic.jupyter.kernelspec import kernel_json  # noqa: E402
from tfgpu_magic.language.policy import Policy  # noqa: E402

SIDES = {"local": None, "slurm": "--gres=gpu:1"}


def start_to_ready(server: JupyterServer, name: str) -> float:
    """Seconds from the start request to the kernel's first answer; the kernel is deleted after."""
    began = time.perf_counter()
    kernel_id = server.create_kernel(name)
    kernel = server.connect(kernel_id)
    seconds = time.perf_counter() - began
    kernel.close()
    server.delete_kernel(kernel_id)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed samples per side")
    options = parser.parse_args()
    reason = missing_slurm()
    if reason:
        print(f"bench_slurm: {reason}", file=sys.stderr)
        return 2
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    with private_cluster() as cluster, isolated_jupyter() as env:
        print(f"private Slurm started in {cluster.started_in:.2f} s")
        env.environ.update(SLURM_CONF=cluster.env["SLURM_CONF"], PATH=cluster.env["PATH"])
        for side, slurm in SIDES.items():
            spec = kernel_json(Policy(), slurm=slurm)
            spec["argv"] = cluster.fake_nvml_command(spec["argv"])
            (env.kernels_dir / side).mkdir(parents=True)
            (env.kernels_dir / side / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
        with running_server(env) as server:
            for index in range(options.repeat + 1):
                order = list(SIDES) if index % 2 == 0 else list(reversed(SIDES))
                for side in order:
                    seconds = start_to_ready(server, side)
                    if index:  # the first pair is untimed: first-time setup
                        samples[side].append(seconds)
            for side in SIDES:
                server.create_kernel(side)
            jobs_running = len(cluster.job_ids())
            stop_pids([server.process.pid])
            left = cluster.job_ids()
    local, slurm = (statistics.median(samples[side]) for side in SIDES)
    for side in SIDES:
        print(f"{side:>5}: start to ready, median {statistics.median(samples[side]):.2f} s "
              f"(samples: {', '.join(f'{s:.2f}' for s in samples[side])})")
    print(f"slurm / local: {slurm / local:.2f}x")
    print(f"jobs running before the server stopped: {jobs_running}; left after it stopped: {len(left)}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
