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
write of the file) and when nothing changed (snapshot and compare only); and the cell marks the history
needs: the `pre_run_cell`/`post_run_cell` events of a real `InteractiveShell` with the publisher's pair
registered, against the same events without it.

Memory history (`serverext/history.py`): every kernel of the server above is given a full hour of samples
and cells when it is first sampled (the server's config wraps `History.record`: the hour is fed at once),
so the kernel endpoint answers with a full history (`kernel`, no `?since=`; the sidebar's first request)
and with what is new (`poll`, `?since=` its last `next_since`). In this process: the sampler's CPU
seconds per wall second with `KERNELS` stand-ins (their state files and the fake NVML as above), all busy
(every tick reads NVML and every state file: the worst case) and all idle (nothing changes: nothing is
read); and the bytes an hour of samples of `KERNELS` kernels takes (tracemalloc), for a kernel on one card
with TensorFlow, every figure moving at every sample, and for the widest samples (`MAX_SERIES` figures).

`python benchmarks/bench_serverext.py [--requests N]`; exit status 1 if the p95 handler time misses 50 ms
(the full history included) or a poll's 10 ms.
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
POLL_TARGET_MS = 10.0
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


ENDPOINTS = ("gpus", "kernel", "poll")
HOUR_FILL = """
# Written by benchmarks/bench_serverext.py: each kernel's history gets an hour of samples, and a cell every
# ten samples, the first time it is sampled (the figures move at every sample).
from tfgpu_magic.serverext import history as _history

_record = _history.History.record


def _hour_first(self, kernel_id, now, figures, cells, busy):
    known = self.kernels.get(kernel_id)
    if figures and (known is None or len(known.samples) < _history.SAMPLES):
        kernel = self.kernels[kernel_id] = _history.KernelHistory()
        for step in range(_history.SAMPLES):
            t = now - (_history.SAMPLES - step) * self.interval
            if step % 10 == 0:
                kernel.mark([{"execution_count": step // 10 + 1, "start": t, "end": t + 9 * self.interval}], t)
            kernel.add(t, tuple((key, value + step * 4096) for key, value in figures), True)
    return _record(self, kernel_id, now, figures, cells, busy)


_history.History.record = _hour_first
"""


def handler_times(requests: int, cache_seconds: float, spacing: float) -> dict[str, dict[str, float]]:
    """Per endpoint, p50/p95 handler and round-trip ms over `requests` alternating GETs, `spacing` s apart."""
    with isolated_jupyter("tfgpu-bench-serverext-") as env:
        placement = env.root / "placement.json"
        write_fake_gpu_server_config(env.config_dir, placement)
        with (env.config_dir / "jupyter_server_config.py").open("a", encoding="utf-8") as config:
            config.write(HOUR_FILL)
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
            since = wait_until(lambda: full_histories(server, ids), 60, "an hour of history in every kernel")
            for index in range(10):  # warm up: imports, first reads
                timed_get(server, "api/tfgpu/gpus" if index % 2 else f"api/tfgpu/kernels/{ids[index]}")
            samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ENDPOINTS}
            for index in range(requests):
                name = ENDPOINTS[index % len(ENDPOINTS)]
                kernel_id = ids[index % KERNELS]
                path = {"gpus": "api/tfgpu/gpus", "kernel": f"api/tfgpu/kernels/{kernel_id}",
                        "poll": f"api/tfgpu/kernels/{kernel_id}?since={since[kernel_id]!r}"}[name]
                spent, whole = timed_get(server, path)
                samples[name][0].append(spent)
                samples[name][1].append(whole)
                time.sleep(spacing)
    return {name: {"handler_p50_ms": percentile(handler, 0.5), "handler_p95_ms": percentile(handler, 0.95),
                   "roundtrip_p50_ms": percentile(trip, 0.5), "roundtrip_p95_ms": percentile(trip, 0.95)}
            for name, (handler, trip) in samples.items()}


def full_histories(server: JupyterServer, ids: list[str]) -> dict[str, float] | None:
    """Each kernel's `next_since` once every kernel's reply carries a full ring (None before)."""
    from tfgpu_magic.serverext.history import SAMPLES

    found = {}
    for kernel_id in ids:
        memory = server.request("GET", f"api/tfgpu/kernels/{kernel_id}")["history"]
        if len(memory["times"]) < SAMPLES:
            return None
        found[kernel_id] = memory["next_since"]
    return found


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


class StandIns:
    """What `handlers.Sampler` asks of a server's kernel manager, for `KERNELS` stand-ins in `runtime`."""

    def __init__(self, ids: list[str], runtime: Path) -> None:
        self.ids = ids
        self.connection_dir = str(runtime)
        self.state = "idle"

    def list_kernels(self) -> list[dict[str, str]]:
        return [{"id": kernel_id, "execution_state": self.state} for kernel_id in self.ids]

    def get_kernel(self, kernel_id: str) -> Any:
        raise KeyError(kernel_id)  # no provisioner: the pid comes from the published state


def sampling_cost(ticks: int = 40) -> dict[str, float]:
    """The sampler's CPU seconds per wall second (`process_time` of this process, its reading threads
    included, per tick, over `SAMPLE_SECONDS`) with `KERNELS` stand-ins on the fake cards, each with a
    published state carrying TensorFlow's figures: idle (after the first samples) and busy."""
    import asyncio
    import logging
    import subprocess
    import uuid

    from fake_nvml import FakeNvml, four_gpus

    from tfgpu_magic.gpus import inventory, processes
    from tfgpu_magic.serverext.handlers import Readings, Sampler
    from tfgpu_magic.serverext.history import SAMPLE_SECONDS

    ids = [str(uuid.uuid4()) for _ in range(KERNELS)]
    shared = inventory.shared_nvml
    with tempfile.TemporaryDirectory() as tmp:
        runtime = Path(tmp)
        stand_ins = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "ipykernel_launcher",
                                       "-f", str(runtime / f"kernel-{kernel_id}.json")]) for kernel_id in ids]
        try:
            gpus = four_gpus(this_kernel=False)
            for index, (kernel_id, process) in enumerate(zip(ids, stand_ins)):
                wait_until(lambda: processes.runs_kernel(process.pid, kernel_id), 30, f"stand-in {kernel_id}")
                gpus[index % 3].processes.append((process.pid, 512 * (1 + index % 7)))
                record = published_state(kernel_id, process.pid, gpus[index % 3].uuid)
                path = kernelstate.state_path(kernel_id, runtime)
                path.write_text(json.dumps(record))
                path.chmod(0o600)
            nvml = inventory.Nvml(module=FakeNvml(gpus))
            inventory.shared_nvml = lambda: nvml
            manager = StandIns(ids, runtime)
            serverapp = SimpleNamespace(kernel_manager=manager, log=logging.getLogger("bench"))
            readings = Readings(serverapp, 0.0)
            sampler = Sampler(serverapp, readings)

            async def per_tick() -> float:
                assert await sampler.tick()  # the first samples (idle: new kernels; busy: every tick)
                spent = []
                for _ in range(ticks):
                    started = time.process_time()
                    await sampler.tick()
                    spent.append(time.process_time() - started)
                return statistics.median(spent)

            figures = {}
            for state in ("idle", "busy"):
                manager.state = state
                figures[state] = asyncio.run(per_tick()) / SAMPLE_SECONDS
            assert all(len(readings.history.kernels[kernel_id].samples) > ticks for kernel_id in ids)
            return figures
        finally:
            inventory.shared_nvml = shared
            for process in stand_ins:
                process.kill()
                process.wait(10)


def published_state(kernel_id: str, pid: int, card: str) -> dict[str, Any]:
    """A state as a kernel with TensorFlow initialized on `card` publishes it, with its figures and cells."""
    from tfgpu_magic.controller import Controller
    from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog

    controller = Controller(environ={}, catalog=InventoryCatalog(Inventory(error="none")))
    record = kernelstate.snapshot(controller, kernel_id, keep=True)
    record["tensorflow"].update(state="initialized", memory=[{"device": "GPU:0", "card": card, "current": 3 << 30,
                                                              "peak": 4 << 30}])
    now = time.time()
    record["cells"] = [{"execution_count": n, "start": now + n, "end": now + n + 0.5} for n in range(16)]
    return {**record, "pid": pid, "written": now}


def history_memory() -> dict[str, float]:
    """Bytes (tracemalloc) of an hour of samples of `KERNELS` kernels, every figure moving at every sample,
    a cell every ten samples: one card with TensorFlow (3 figures), and the widest samples (`MAX_SERIES`)."""
    import tracemalloc

    from tfgpu_magic.serverext.history import FIGURES, MAX_SERIES, SAMPLE_SECONDS, SAMPLES, History

    one_card = [(1, "nvml", "used"), (1, "tensorflow", "current"), (1, "tensorflow", "peak")]
    widest = [(gpu, "nvml" if figure == "used" else "torch", figure) for gpu in range(8) for figure in FIGURES]
    assert len(widest) == MAX_SERIES
    found = {}
    for name, keys in (("one_card", one_card), ("widest", widest)):
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        memory = History()
        for kernel in range(KERNELS):
            for step in range(SAMPLES):
                t = 1.7e9 + step * SAMPLE_SECONDS
                cells = [{"execution_count": step // 10 + 1, "start": t, "end": t + 19.0}] if step % 10 == 0 else []
                figures = tuple((key, (3 << 30) + step * 4096 + n) for n, key in enumerate(keys))
                memory.record(f"kernel-{kernel}", t, figures, cells, busy=True)
        found[name] = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert all(len(kernel.samples) == SAMPLES for kernel in memory.kernels.values())
    return found


def cell_hooks_cost(cells: int = 20000, pairs: int = 10) -> dict[str, float]:
    """µs a cell spends in a real `InteractiveShell`'s `pre_run_cell` and `post_run_cell` events (what
    IPython triggers around every cell) with the publisher's cell marks (`before_cell`, and the end mark in
    `after_cell`), and with `after_cell` alone as it was before the marks (alternating, `run.paired`;
    medians). Timed around the events alone: a whole empty cell (~150 µs here) varies by more than the
    marks cost on a shared machine."""
    from IPython.core.interactiveshell import ExecutionInfo, ExecutionResult, InteractiveShell
    from run import paired

    from tfgpu_magic.controller import Controller
    from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog

    shell = InteractiveShell.instance()
    controller = Controller(environ={}, catalog=InventoryCatalog(Inventory(error="none")))
    info = ExecutionInfo("pass", store_history=True, silent=False, shell_futures=True, cell_id=None)
    result = ExecutionResult(info)
    result.execution_count = 1
    with tempfile.TemporaryDirectory() as tmp:
        shell.kernel = SimpleNamespace(parent=SimpleNamespace(abs_connection_file=f"{tmp}/kernel-b2.json"))
        publisher = kernelstate.start_publishing(shell, controller)
        assert publisher is not None
        marks = publisher.cells

        def sample(which: str) -> float:
            registered = publisher.before_cell in shell.events.callbacks["pre_run_cell"]
            if which == "measured" and not registered:
                shell.events.register("pre_run_cell", publisher.before_cell)
            elif which == "baseline" and registered:
                shell.events.unregister("pre_run_cell", publisher.before_cell)
            marks.clear()  # no open cell: `after_cell` marks no end
            started = time.perf_counter()
            for _ in range(cells):
                shell.events.trigger("pre_run_cell", info)
                shell.events.trigger("post_run_cell", result)
            return (time.perf_counter() - started) / cells

        try:
            baseline, measured = paired(sample, pairs)
        finally:
            kernelstate.stop_publishing()
            del shell.kernel
    return {"with_marks_us": statistics.median(measured) * 1e6, "without_us": statistics.median(baseline) * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args(argv)
    figures = {"cold": handler_times(args.requests, 0.0, 0.0), "cached": handler_times(args.requests, 1.0, 0.3)}
    kernel = publish_cost()
    hooks = cell_hooks_cost()
    sampler = sampling_cost()
    held = history_memory()
    print(f"server extension, 4 fake GPUs, {KERNELS} kernels with published states, {args.requests} requests:")
    for name, why in (("cold", f"every request reads NVML, /proc and {KERNELS} state files"),
                      ("cached", "default 1 s reuse, a request every 0.3 s")):
        print(f"  {name}: {why}")
        for endpoint in ENDPOINTS:
            f = figures[name][endpoint]
            print(f"    {endpoint:<7} handler p50 {f['handler_p50_ms']:.1f} ms, p95 {f['handler_p95_ms']:.1f} ms "
                  f"(round trip p50 {f['roundtrip_p50_ms']:.1f} ms, p95 {f['roundtrip_p95_ms']:.1f} ms)")
    print("    (kernel: a full hour of history, no ?since=; poll: ?since= the last next_since)")
    print(f"kernel side: publishing a state change {kernel['publish_change_us']:.0f} µs, "
          f"a check with nothing changed {kernel['publish_no_change_us']:.0f} µs (medians)")
    print(f"kernel side: IPython's pre/post_run_cell events of one cell {hooks['with_marks_us']:.2f} µs with the "
          f"cell marks, {hooks['without_us']:.2f} µs without (`after_cell`'s look at the frameworks alone; medians)")
    print(f"history sampler, {KERNELS} kernels: {sampler['busy'] * 100:.3f} % of a core all busy (NVML and every "
          f"state read each tick), {sampler['idle'] * 100:.4f} % all idle (nothing read)")
    print(f"history memory, an hour of {KERNELS} kernels: {held['one_card'] / 1e6:.1f} MB (one card, TensorFlow: "
          f"{held['one_card'] / KERNELS / 1e3:.0f} KB a kernel), {held['widest'] / 1e6:.1f} MB (widest samples: "
          f"{held['widest'] / KERNELS / 1e3:.0f} KB a kernel)")
    worst = max(figures["cold"][endpoint]["handler_p95_ms"] for endpoint in ENDPOINTS)
    poll = figures["cold"]["poll"]["handler_p95_ms"]
    met = worst <= TARGET_MS and poll <= POLL_TARGET_MS
    print(f"target: p95 handler time ≤ {TARGET_MS:.0f} ms, a poll's ≤ {POLL_TARGET_MS:.0f} ms: "
          f"{'met' if met else 'MISSED'} ({worst:.1f} ms, poll {poll:.1f} ms, cold)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
