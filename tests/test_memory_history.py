"""Each kernel's GPU memory over time, kept by the server extension (`tfgpu_magic/serverext/history.py`,
sampled by `handlers.Sampler`, sent in `GET /api/tfgpu/kernels/<id>` as `$defs/memoryHistory`).

The ring and its replies are tested on their own (bounds, eviction, what an idle kernel costs, the
`since` filter, cell marks); then a real jupyter_server in this process (test_serverext.py's fixtures,
imported, not copied) with its NVML the four fake cards, and a real ipykernel that publishes: the test
moves the kernel's memory on a fake card while a cell of the kernel runs, and reads the history back,
checked against the schema. The kernel side (cells marked in memory, published by the watch) runs on a
controller over `FakeTF` with IPython's real `EventManager`.

What this cannot show: real cards. NVML's figures are the fake's, placed by the test.
"""

from __future__ import annotations

import json
import tracemalloc
from types import SimpleNamespace
from typing import Any

import pytest
from servers import wait_until
from test_serverext import (  # noqa: F401 (fixtures)
    EXTENSION_CONFIG, GIB, Api, NotebookKernel, RecordingNvml, _published, api, conforms, echo_kernel_spec, fake_kernel, fake_nvml,
    http_server, http_server_client, http_server_port, io_loop, jp_argv, jp_asyncio_loop, jp_auth_header, jp_base_url,
    jp_config_dir, jp_configurable_serverapp, jp_data_dir, jp_env_config_path, jp_env_jupyter_path, jp_environ,
    jp_fetch, jp_home_dir, jp_http_port, jp_kernel_dir, jp_logging_stream, jp_nbconvert_templates, jp_root_dir,
    jp_runtime_dir, jp_server_cleanup, jp_serverapp, jp_system_config_path, jp_system_jupyter_path, jp_web_app,
    kernel_shell,
)
from tornado.httpclient import HTTPClientError

from tfgpu_magic.gpus.inventory import MIB
from tfgpu_magic.jupyter import kernelstate
from tfgpu_magic.serverext import history
from tfgpu_magic.serverext.history import CELLS_KEPT, MAX_SERIES, SAMPLES, History, KernelHistory

TICK = 0.25
"""The test server's `history_seconds`: a sample every quarter second while a kernel is busy."""


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    """The installed enabling file, no reuse of a reading, and fast samples."""
    config = json.loads(EXTENSION_CONFIG.read_text(encoding="utf-8"))
    return {**config, "TFGPUServer": {"cache_seconds": 0, "history_seconds": TICK}}


def figures(*values: int | None, gpu: int = 0) -> history.Figures:
    """NVML's figure, then TensorFlow's current and peak, ... on card `gpu` (as many as given)."""
    keys = [("nvml", "used"), ("tensorflow", "current"), ("tensorflow", "peak"), ("jax", "current"),
            ("jax", "peak"), ("torch", "current"), ("torch", "peak"), ("torch", "reserved")]
    return tuple(((gpu, source, figure), value) for (source, figure), value in zip(keys, values))


def wide(step: int) -> history.Figures:
    """`MAX_SERIES` figures (8 cards, 4 each), all moved at each `step`: the costliest sample."""
    return tuple(sorted((((gpu, source, figure), (step + gpu) * GIB + 1)
                         for gpu in range(8) for source, figure in
                         [("nvml", "used"), ("tensorflow", "current"), ("tensorflow", "peak"), ("torch", "reserved")]),
                        key=history.order))


def cell(count: int | None, start: float, end: float | None) -> dict[str, Any]:
    return {"execution_count": count, "start": start, "end": end}


# ----- the ring ---------------------------------------------------------------------------------------
def test_the_ring_keeps_the_last_samples_within_the_stated_bytes() -> None:
    """A busy kernel sampled past the ring's length keeps exactly the newest `SAMPLES`; a full ring of the
    widest samples, every value moving, stays under the module's stated 480 B a sample; an unchanged
    sample shares its values with the one before."""
    kernel = KernelHistory()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for step in range(SAMPLES + 50):
            kernel.add(1000.0 + step, wide(step), busy=True)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert len(kernel.samples) == SAMPLES
    assert kernel.samples[0][0] == 1050.0 and kernel.samples[-1][0] == 1000.0 + SAMPLES + 49
    assert grown < SAMPLES * 480, f"{grown / SAMPLES:.0f} B a sample"
    assert all(len(values) == MAX_SERIES for _, _, values in kernel.samples)
    kernel.add(5000.0, wide(SAMPLES + 49), busy=True)
    (_, keys, values), (_, last_keys, last_values) = kernel.samples[-2], kernel.samples[-1]
    assert last_keys is keys and last_values is values
    reply = kernel.reply(None, 2.0)
    assert len(reply["times"]) == SAMPLES and reply["oldest"] == 1051.0 and len(reply["series"]) == MAX_SERIES


def test_an_idle_kernel_whose_figures_stay_put_takes_no_samples() -> None:
    """Samples are taken while busy and once after; an idle kernel only when a figure moved."""
    kernel = KernelHistory()
    taken = [kernel.add(float(t), figures(GIB), busy=False) for t in range(5)]
    assert taken == [True, False, False, False, False]  # the first, then nothing moved
    assert [kernel.add(float(t), figures(GIB), busy=True) for t in range(5, 8)] == [True, True, True]
    assert kernel.add(8.0, figures(GIB), busy=False) is True  # the sample after the cell
    assert kernel.add(9.0, figures(GIB), busy=False) is False
    assert kernel.add(10.0, figures(2 * GIB), busy=False) is True  # a thread of its own allocated
    assert [sample[0] for sample in kernel.samples] == [0.0, 5.0, 6.0, 7.0, 8.0, 10.0]


def test_since_gives_only_what_is_new_and_the_cursor_to_ask_with_next() -> None:
    memory = History(interval=2.0)
    memory.record("k", 10.0, figures(GIB), [cell(1, 9.0, None)], busy=True)
    memory.record("k", 12.0, figures(2 * GIB, GIB), [cell(1, 9.0, None)], busy=True)
    first = memory.reply("k", None)
    assert first["times"] == [10.0, 12.0] and first["running"] == [1, 1] and first["next_since"] == 12.0
    assert [(s["source"], s["figure"], s["values"]) for s in first["series"]] == [
        ("nvml", "used", [GIB, 2 * GIB]), ("tensorflow", "current", [None, GIB])]
    assert first["cells"] == [cell(1, 9.0, None)]
    memory.record("k", 14.0, figures(3 * GIB, GIB), [cell(1, 9.0, 13.0), cell(2, 13.5, None)], busy=True)
    second = memory.reply("k", first["next_since"])
    assert second["since"] == 12.0 and second["times"] == [14.0] and second["running"] == [2]
    assert [s["values"] for s in second["series"]] == [[3 * GIB], [GIB]]
    assert second["cells"] == [cell(1, 9.0, 13.0), cell(2, 13.5, None)]  # cell 1 again: it ended
    empty = memory.reply("k", second["next_since"])
    assert (empty["times"], empty["series"], empty["cells"], empty["next_since"]) == ([], [], [], 14.0)
    assert memory.reply("gone", 5.0) == history.empty_reply(5.0, 2.0)
    memory.record("k", 13.0, figures(GIB), [], busy=True)  # the clock stepped back: still after the cursor
    assert memory.reply("k", 14.0)["times"] == [14.001]
    for reply in (first, second, empty):
        conforms(reply, "memoryHistory")


def test_cells_mark_the_samples_and_an_open_cell_ends_where_the_next_one_starts() -> None:
    kernel = KernelHistory()
    kernel.mark([cell(3, 10.0, None)], 10.5)
    kernel.mark([cell(4, 20.0, 25.0)], 26.0)  # cell 3's end was never published (a restart)
    assert kernel.cells[10.0][:3] == (3, 10.0, 20.0)
    for t, busy in ((11.0, True), (22.0, True), (27.0, False)):
        kernel.add(t, figures(int(t) * GIB), busy)
    assert kernel.reply(None, 2.0)["running"] == [3, 4, None]
    for start in range(CELLS_KEPT + 10):
        kernel.mark([cell(start, 100.0 + start, 100.5 + start)], 200.0 + start)
    assert len(kernel.cells) == CELLS_KEPT and min(kernel.cells) == 110.0



def test_an_idle_kernels_state_is_read_until_its_last_cell_ends_within_a_bound() -> None:
    """After its last busy sample, a kernel's state is read for `SETTLE_SECONDS`; while its last cell has
    no end yet (a loaded kernel publishes it late), up to `OPEN_CELL_SECONDS`; never NVML for it."""
    memory = History()
    memory.record("k", 100.0, figures(GIB), [cell(1, 99.0, None)], busy=True)
    late = 100.0 + history.SETTLE_SECONDS + 1
    assert memory.wants_reading({"k"}, set()) is True  # busy at its last sample: the next one is taken
    memory.record("k", 101.0, figures(GIB), [cell(1, 99.0, None)], busy=False)
    assert memory.wants_reading({"k"}, set()) is False
    assert memory.settling({"k"}, late) is True  # its cell's end is still to come
    assert memory.settling({"k"}, 100.0 + history.OPEN_CELL_SECONDS + 1) is False  # it never came
    memory.record("k", late, None, [cell(1, 99.0, late - 0.5)], busy=False)
    assert memory.kernels["k"].cells[99.0][:3] == (1, 99.0, late - 0.5)
    assert memory.settling({"k"}, late + 0.1) is False  # ended: nothing more to read

def test_a_kernels_history_goes_with_it() -> None:
    memory = History()
    for kernel_id in ("a", "b"):
        memory.record(kernel_id, 1.0, figures(GIB), [], busy=False)
    assert memory.wants_reading({"a", "b"}, set()) is False
    assert memory.wants_reading({"a", "b", "c"}, set()) is True  # a new kernel: its first sample
    assert memory.wants_reading({"a", "b"}, {"b"}) is True
    memory.keep_only({"b"})
    assert set(memory.kernels) == {"b"} and memory.reply("a", None)["times"] == []


# ----- the kernel side ----------------------------------------------------------------------------
def test_the_kernel_marks_cells_in_memory_and_the_watch_publishes_them(
        fake_kernel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pre_run_cell` and `post_run_cell` (IPython's real `EventManager`) only mark the cell in memory;
    the watch the first cell starts writes the marks, one write for many cells."""
    from IPython.core.events import EventManager, available_events

    _, controller, connection = fake_kernel
    monkeypatch.setattr(kernelstate, "MEMORY_SECONDS", 0.5)
    shell = kernel_shell(connection)
    shell.events = EventManager(shell, available_events)
    shell.execution_count = 7
    publisher = kernelstate.start_publishing(shell, controller)
    path = kernelstate.state_path("k1", connection.parent)
    assert publisher is not None and _published(path)["cells"] == []
    writes = None
    for count in (7, 8, 9):
        shell.execution_count = count
        shell.events.trigger("pre_run_cell", SimpleNamespace(store_history=True))
        shell.events.trigger("post_run_cell", SimpleNamespace(execution_count=count))
        writes = publisher.writes if writes is None else writes  # the first cell's look at the frameworks writes
    assert publisher.writes == writes  # no write by a cell
    shell.events.trigger("pre_run_cell", SimpleNamespace(store_history=False))  # a silent run: no count
    published = wait_until(lambda: (found := _published(path)["cells"]) and len(found) == 4 and found, 10,
                           "the watch publishing the cells")
    assert [c["execution_count"] for c in published] == [7, 8, 9, None] and published[-1]["end"] is None
    assert all(c["start"] <= c["end"] for c in published[:3]) and publisher.writes <= writes + 2
    kernelstate.stop_publishing()
    assert shell.events.callbacks["pre_run_cell"] == [] and shell.events.callbacks["post_run_cell"] == []


# ----- a real kernel under a real server ----------------------------------------------------------------
def kernel_history(api: Api, kernel_id: str, since: float | None = None) -> dict[str, Any]:
    params = {} if since is None else {"params": {"since": repr(since)}}
    return conforms(api.call("GET", "api", "tfgpu", "kernels", kernel_id, **params), "kernelReply")["history"]


def series(found: dict[str, Any], gpu: int, source: str = "nvml", figure: str = "used") -> list[int | None]:
    """The values of one series (none where the history has no such series)."""
    named = [s["values"] for s in found["series"] if (s["gpu"], s["source"], s["figure"]) == (gpu, source, figure)]
    return named[0] if named else []


def test_a_real_kernels_memory_is_followed_through_a_cell_and_marked_with_it(
        api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    """Idle and unasked, the server reads nothing. While a cell of a real kernel sleeps, its memory on
    fake GPU 1 goes to 1 GiB, then 3 GiB: the history has both, in samples marked with that cell's
    In [n], which the kernel published with its start and end. A poll with `since` carries only what is
    new; the history goes when the kernel does."""
    notebook = NotebookKernel(api, jp_serverapp, "history.ipynb")
    readings = jp_serverapp.web_app.settings["tfgpu_readings"]
    try:
        notebook.publish("growth on")
        api.pause(4 * TICK)
        reads = len(fake_nvml.threads)
        api.pause(8 * TICK)
        assert len(fake_nvml.threads) == reads, "an idle server with nobody asking read NVML"
        msg_id = notebook.kernel.client.execute("import time; time.sleep(8)")
        wait_until(lambda: api.pause(TICK) or readings.history.kernels[notebook.kernel_id].busy, 20, "a busy sample")
        for mib in (1024, 3 * 1024):
            fake_nvml.gpus[1].processes = [(notebook.pid, mib)]
            wait_until(lambda: api.pause(TICK) or mib * MIB in series(kernel_history(api, notebook.kernel_id), 1),
                       10, f"a sample of {mib} MiB")
        assert readings.history.kernels[notebook.kernel_id].busy, "the cell ended too soon for this test"
        while (reply := notebook.kernel.client.get_shell_msg(timeout=30))["parent_header"].get("msg_id") != msg_id:
            pass
        count = reply["content"]["execution_count"]

        def ended() -> dict[str, Any] | None:
            api.pause(TICK)
            found = kernel_history(api, notebook.kernel_id)
            return found if any(c["execution_count"] == count and c["end"] for c in found["cells"]) else None

        found = wait_until(ended, 45, "the kernel publishing the cell's end")  # 2 s ticks, on a loaded machine
    finally:
        notebook.kernel.close()
    (run,) = [c for c in found["cells"] if c["execution_count"] == count]
    used = series(found, 1)
    during = [value for t, value, mark in zip(found["times"], used, found["running"])
              if run["start"] <= t <= run["end"] and mark == count]
    assert GIB in during and 3 * GIB in during, (used, found["running"])
    assert found["interval_seconds"] == TICK and found["span_seconds"] == SAMPLES * TICK
    poll = kernel_history(api, notebook.kernel_id, found["next_since"])
    assert len(poll["times"]) <= 2 and all(t > found["next_since"] for t in poll["times"])
    for since in ("yesterday", "nan", "inf", ""):
        with pytest.raises(HTTPClientError) as refused:
            api.call("GET", "api", "tfgpu", "kernels", notebook.kernel_id, params={"since": since})
        assert refused.value.code == 400
        assert "since must be a number" in json.loads(refused.value.response.body)["message"]
    api.call("DELETE", "api", "sessions", notebook.session_id)
    wait_until(lambda: api.pause(TICK) or notebook.kernel_id not in readings.history.kernels, 20,
               "the history going with its kernel")
    with pytest.raises(HTTPClientError) as missing:
        api.call("GET", "api", "tfgpu", "kernels", notebook.kernel_id)
    assert missing.value.code == 404
