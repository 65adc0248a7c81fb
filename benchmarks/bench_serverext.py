#!/usr/bin/env python
"""Handler time of each endpoint of the server extension with the four fake GPUs and 30 kernels, and the
kernel-side cost of publishing a state change.

Server: a real `jupyter_server` (temp dirs, token; tests/servers.py) whose NVML is the four fake cards
(tests/test_serverext.py's `write_fake_gpu_server_config`), with 30 notebook sessions. Their kernels are
stand-ins that only sleep but look like server kernels to /proc (`ipykernel_launcher -f …/kernel-<id>.json`
on the command line): 30 real ipykernels would need ~2 GB and measure nothing more, since no handler asks
a kernel anything. Each stand-in is placed on a fake card and has published a state file (as
`jupyter.kernelstate` writes it), so every request reads NVML, 30 state files and /proc as in use.
`GET /api/tfgpu/gpus` and `GET /api/tfgpu/kernels/<id>` alternate, first with no reuse of a reading
(`TFGPUServer.cache_seconds = 0`: every request reads everything; the worst case), then with the default
1 s reuse at the front end's 3 s poll spread over 10 tabs (most requests reuse a reading). The handler time
is the server's own figure (`Server-Timing`); the round trip over loopback is given beside it.

Kernel side: `Publisher.changed()` on a real controller after a policy change (snapshot, JSON, atomic
write of the file) and when nothing changed (snapshot and compare only).

`python benchmarks/bench_serverext.py [--requests N]`; exit status 1 if the p95 handler time misses 50 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

from servers import JupyterServer, isolated_jupyter, processes_naming, running_server, wait_until  # noqa: E402
from test_serverext import place, write_fake_gpu_server_config  # noqa: E402

from tfgpu_magic.jupyter import kernelstate  # noqa: E402

KERNELS = 30
TARGET_MS = 50.0
STAND_IN = "stand-in"
"""The kernelspec of the sleeping stand-ins."""


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def timed_get(server: JupyterServer, path: str) -> tuple[float, float]:
    """(handler ms from `Server-Timing`, round trip ms) of one authenticated GET."""
    request = urllib.request.Request(server.url + path, headers={"Authorization": f"token {server.token}"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310 (our own loopback server)
        reply.read()
        timing = reply.headers["Server-Timing"]
    return float(timing.split("dur=")[1]), (time.perf_counter() - started) * 1000


def start_kernels(server: JupyterServer, placement: Path) -> list[str]:
    """`KERNELS` notebook sessions on stand-in kernels, each placed on a fake card with a published state
    (what a kernel with `growth on` and TensorFlow initialized writes)."""
    from tfgpu_magic.controller import Controller
    from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog

    controller = Controller(environ={}, catalog=InventoryCatalog(Inventory(error="none")))
    controller.policy = controller.edit_policy(["growth on"])
    ids, pids = [], {}
    for index in range(KERNELS):
        path = f"project/notebook-{index:02d}.ipynb"
        session = server.request("POST", "api/sessions", {"path": path, "name": path, "type": "notebook",
                                                          "kernel": {"name": STAND_IN}})
        ids.append(session["kernel"]["id"])
    for index, kernel_id in enumerate(ids):
        (pid,) = wait_until(lambda: processes_naming(f"kernel-{kernel_id}.json"), 30, f"stand-in {kernel_id}")
        pids[pid] = (index % 3, 512 * (1 + index % 7))
        record = kernelstate.snapshot(controller, kernel_id, keep=True)
        record["tensorflow"].update(state="initialized", initialized_by={"where": "cell", "execution_count": 3,
                                                                         "line": "model.fit(x, y)"})
        path = kernelstate.state_path(kernel_id, server.env.runtime_dir)
        path.write_text(json.dumps({**record, "pid": pid, "written": time.time()}))
        path.chmod(0o600)
    place(placement, pids)
    return ids


ENDPOINTS = ("gpus", "kernel")


def handler_times(requests: int, cache_seconds: float, spacing: float) -> dict[str, dict[str, float]]:
    """Per endpoint, p50/p95 handler and round-trip ms over `requests` alternating GETs, `spacing` s apart."""
    with isolated_jupyter("tfgpu-bench-serverext-") as env:
        placement = env.root / "placement.json"
        write_fake_gpu_server_config(env.config_dir, placement)
        env.write_kernelspec(STAND_IN)
        spec = env.kernels_dir / STAND_IN / "kernel.json"
        data = json.loads(spec.read_text())
        data["argv"] = [sys.executable, "-c", "import time; time.sleep(3600)",
                        "ipykernel_launcher", "-f", "{connection_file}"]
        spec.write_text(json.dumps(data))
        with running_server(env, extra_args=(f"--TFGPUServer.cache_seconds={cache_seconds}",)) as server:
            ids = start_kernels(server, placement)
            answer = server.request("GET", "api/tfgpu/gpus")
            held = sum(len(gpu["processes"]) for gpu in answer["gpus"])
            assert held >= KERNELS, f"the fake cards list {held} processes, not the {KERNELS} kernels"
            for index in range(10):  # warm up: imports, first reads
                timed_get(server, "api/tfgpu/gpus" if index % 2 else f"api/tfgpu/kernels/{ids[index]}")
            samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ENDPOINTS}
            for index in range(requests):
                name = ENDPOINTS[index % 2]
                path = "api/tfgpu/gpus" if name == "gpus" else f"api/tfgpu/kernels/{ids[index % KERNELS]}"
                spent, whole = timed_get(server, path)
                samples[name][0].append(spent)
                samples[name][1].append(whole)
                time.sleep(spacing)
    return {name: {"handler_p50_ms": percentile(handler, 0.5), "handler_p95_ms": percentile(handler, 0.95),
                   "roundtrip_p50_ms": percentile(trip, 0.5), "roundtrip_p95_ms": percentile(trip, 0.95)}
            for name, (handler, trip) in samples.items()}


def publish_cost(repeat: int = 400) -> dict[str, float]:
    """Median µs of one `Publisher.changed()` after a policy change, and with nothing changed."""
    from tfgpu_magic.controller import Controller
    from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog

    controller = Controller(environ={}, catalog=InventoryCatalog(Inventory(error="none")))
    policies = [controller.edit_policy(["growth on", "visible 0,1"]), controller.edit_policy(["limit 4GB 0"])]
    with tempfile.TemporaryDirectory() as tmp:
        shell = SimpleNamespace(kernel=SimpleNamespace(parent=SimpleNamespace(abs_connection_file=f"{tmp}/kernel-b1.json")))
        publisher = kernelstate.start_publishing(shell, controller)
        assert publisher is not None
        changed, same = [], []
        for index in range(repeat):
            controller.policy = policies[index % 2]
            started = time.perf_counter()
            assert publisher.changed()
            changed.append(time.perf_counter() - started)
            started = time.perf_counter()
            assert not publisher.changed()
            same.append(time.perf_counter() - started)
        kernelstate.stop_publishing()
    return {"publish_change_us": statistics.median(changed) * 1e6, "publish_no_change_us": statistics.median(same) * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args(argv)
    figures = {"cold": handler_times(args.requests, 0.0, 0.0), "cached": handler_times(args.requests, 1.0, 0.3)}
    kernel = publish_cost()
    print(f"server extension, 4 fake GPUs, {KERNELS} kernels with published states, {args.requests} requests:")
    for name, why in (("cold", f"every request reads NVML, /proc and {KERNELS} state files"),
                      ("cached", "default 1 s reuse, a request every 0.3 s")):
        print(f"  {name}: {why}")
        for endpoint in ENDPOINTS:
            f = figures[name][endpoint]
            print(f"    {endpoint:<7} handler p50 {f['handler_p50_ms']:.1f} ms, p95 {f['handler_p95_ms']:.1f} ms "
                  f"(round trip p50 {f['roundtrip_p50_ms']:.1f} ms, p95 {f['roundtrip_p95_ms']:.1f} ms)")
    print(f"kernel side: publishing a state change {kernel['publish_change_us']:.0f} µs, "
          f"a check with nothing changed {kernel['publish_no_change_us']:.0f} µs (medians)")
    worst = max(figures["cold"][endpoint]["handler_p95_ms"] for endpoint in ENDPOINTS)
    verdict = "met" if worst <= TARGET_MS else "MISSED"
    print(f"target: p95 handler time ≤ {TARGET_MS:.0f} ms: {verdict} ({worst:.1f} ms, cold)")
    return 0 if worst <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
