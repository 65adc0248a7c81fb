"""The other frameworks of a kernel (JAX, PyTorch, Keras's backend) in the JupyterLab extension, from
what the kernel publishes (`$defs/frameworks` of tfgpu_magic/jupyter/tfgpu-state.schema.json).

(The browser's types are generated from the schema: tests/test_contract.py fails while they are stale.)

One JupyterLab (test_labextension.py's setup: the server's NVML is the four fake cards) and one
page, in order: a notebook whose kernel (tests/fake_gpu_kernel.py: the same four cards in the kernel)
loads tfgpu_magic shows no framework section; its next cell starts real JAX's backends on two CPU
devices with `KERAS_BACKEND=jax`, then `%tfgpu growth on` can no longer reach JAX. The sidebar shows
JAX's and Keras's lines worded as the kernel's status words them (tfgpu_magic/views/status.py,
`framework_rows`), JAX's own figures on the cards the kernel placed them on, worded as `%tfgpu memory`
says them (tfgpu_magic/views/figures.py, `framework_lines`), and the change locked by JAX's backends
with its reason. Last, a reply the schema accepts (answered by Playwright) with PyTorch started and
its memory fractions, JAX not imported yet and Keras from keras.json: the browser words it as Python does.

JAX's CPU client keeps no allocator statistics (`Device.memory_stats()` is None there; a GPU answers
it from XLA's allocator: `bytes_in_use`, `peak_bytes_in_use`, `bytes_limit`, see
https://docs.jax.dev/en/latest/gpu_memory_allocation.html). GPU-only, so the kernel's devices answer it
as a GPU's do, with the bytes of the live arrays on each device (`GPU_STATS`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from typing import Any, Iterator

import pytest
from fake_gpu_kernel import KERNEL_NAME as FAKE_GPUS_KERNEL
from fake_gpu_kernel import write_kernelspec as write_fake_gpus_kernelspec
from servers import wait_until
from test_browser import browser, notebook_session  # noqa: F401 (the fixture)
from test_labextension import Lab, Page, jupyterlab, lab_env, lab_url, open_page, write_notebook
from test_serverext import conforms, write_fake_gpu_server_config

from tfgpu_magic.frameworks import FrameworkView
from tfgpu_magic.language.sizes import MIB
from tfgpu_magic.tf.apply import Change
from tfgpu_magic.views.figures import framework_lines
from tfgpu_magic.views.status import change_text, framework_rows

NOTEBOOK = "jax.ipynb"
JAX_CELL = """import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["KERAS_BACKEND"] = "jax"
import jax
x = jax.numpy.ones((512, 1024))
y = jax.numpy.ones((1024, 1024), device=jax.devices()[1])"""
CELLS = ("%load_ext tfgpu_magic\n%tfgpu", JAX_CELL, "%tfgpu growth on")
GPU_STATS = """
import jax as _jax

class _GpuStatsDevice:
    '''A real JAX device whose memory_stats() answers with the keys a GPU's does.'''

    def __init__(self, device, limit):
        self._device, self._limit, self._peak = device, limit, 0

    def __getattr__(self, name):
        return getattr(self._device, name)

    def __str__(self):
        return str(self._device)

    def memory_stats(self):
        in_use = sum(a.nbytes for a in _jax.live_arrays() if a.devices() == {self._device})
        self._peak = max(self._peak, in_use)
        return {"bytes_in_use": in_use, "peak_bytes_in_use": self._peak, "bytes_limit": self._limit}

_gpu_devices = [_GpuStatsDevice(device, %d) for device in _jax.local_devices()]
_jax.local_devices = lambda *args, **kwargs: _gpu_devices
"""
"""In the kernel: JAX's devices answer `memory_stats()` (`%d`: the pool limit, `POOL_LIMIT`)."""
POOL_LIMIT = int(0.75 * 80 * 1024) * MIB
"""JAX's default pool: 75% of an 80 GB card (fake_nvml's GPU 0 and 1)."""
GIB = 1024 * MIB

pytestmark = pytest.mark.kernel


# ----- the page ----------------------------------------------------------------------------------------
def views_of(frameworks: dict[str, Any]) -> list[FrameworkView]:
    """The published record as the status's `FrameworkView`s (what `framework_rows` words)."""
    views = []
    for name in ("jax", "torch"):
        record = frameworks[name]
        if record is not None:
            views.append(FrameworkView(
                name, record["version"], record["state"] != "not_imported", record["state"] == "started",
                tuple((variable["name"], variable["value"]) for variable in record["variables"]),
                tuple((fraction["device"], fraction["fraction"]) for fraction in record["fractions"])))
    if frameworks["keras"] is not None:
        views.append(FrameworkView("keras", None, False, False, backend=frameworks["keras"]["backend"],
                                   backend_source=frameworks["keras"]["source"]))
    return views


def figure_rows(frameworks: dict[str, Any], cards: bool) -> dict[str, list[tuple[Any, ...]]]:
    """The record's own figures as `framework_lines` takes them (with or without their card)."""
    return {name: [(row["device"], row["card"] if cards else None, row["current"], row["peak"], row["reserved"])
                   for row in frameworks[name]["memory"]]
            for name in ("jax", "torch") if frameworks[name] is not None and frameworks[name]["memory"]}


def line_of(name: str, row: dict[str, Any], card: bool) -> str:
    return framework_lines({name: [(row["device"], row["card"] if card else None, row["current"], row["peak"],
                                    row["reserved"])]})[0]


class Notebook:
    """The page on `NOTEBOOK`, the server, and the kernel's id."""

    def __init__(self, lab: Lab, page: Page) -> None:
        self.lab = lab
        self.page = page
        self.kernel_id = notebook_session(lab.server, NOTEBOOK)["kernel"]["id"]

    def run_cell(self, index: int) -> None:
        """Run cell `index` from the page, as a user would; returns once it ran."""
        self.page.select_cell(index)
        self.page.run("notebook:run-cell")

    def reply(self) -> dict[str, Any]:
        """`GET /api/tfgpu/kernels/<id>`, what the page gets, checked against the schema."""
        return conforms(self.lab.server.request("GET", f"api/tfgpu/kernels/{self.kernel_id}"), "kernelReply")

    def reply_with_jax_figures(self) -> dict[str, Any] | None:
        """The reply once it has JAX's own figures of two devices; None before."""
        reply = self.reply()
        jax = reply["frameworks"] and reply["frameworks"]["jax"]
        return reply if jax and len(jax["memory"]) == 2 else None

    def framework_rows_shown(self) -> list[tuple[str, str]]:
        rows = self.page.sidebar.locator(".tfgpu-framework")
        return [(rows.nth(i).locator(".tfgpu-framework-label").inner_text(),
                 rows.nth(i).locator(".tfgpu-framework-line").inner_text()) for i in range(rows.count())]

    def framework_rows_once(self, expected: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The sidebar's (label, line) per framework, once they are `expected` or after 30 s."""
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: self.framework_rows_shown() == expected, 30, "the sidebar's framework lines")
        return self.framework_rows_shown()

    def card_figures(self, uuid: str) -> list[str]:
        """The framework figures on the card of GPU `uuid` (the server's index for it)."""
        index = next(gpu["index"] for gpu in self.lab.gpus()["gpus"] if gpu["uuid"] == uuid)
        figures = self.page.sidebar.locator(f".tfgpu-gpu-card[data-index='{index}'] .tfgpu-framework-figure")
        return [figures.nth(i).inner_text().strip() for i in range(figures.count())]

    def kernel_title(self) -> list[str]:
        return (self.page.sidebar.locator(".tfgpu-kernel").get_attribute("title") or "").splitlines()


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with lab_env("tfgpu-labext-frameworks-") as env:
        placement = env.root / "placement.json"
        write_fake_gpu_server_config(env.config_dir, placement)
        write_fake_gpus_kernelspec(env.kernels_dir)
        write_notebook(env.root, NOTEBOOK, CELLS, kernel=FAKE_GPUS_KERNEL)
        with jupyterlab(env) as server:
            yield Lab(server, placement)


@pytest.fixture(scope="module")
def notebook(lab: Lab, browser: Any) -> Iterator[Notebook]:  # noqa: F811
    page = open_page(browser, lab_url(lab.server, NOTEBOOK))
    opened = Notebook(lab, page)
    page.open_sidebar()
    yield opened
    page.page.close()


def test_a_kernel_with_no_other_framework_shows_no_framework_section(notebook: Notebook) -> None:
    notebook.run_cell(0)
    wait_until(lambda: notebook.reply()["published"], 30, "the kernel's state published")
    assert notebook.reply()["frameworks"] == {"jax": None, "torch": None, "keras": None}
    notebook.page.sidebar_says("This notebook: .* · no policy · (.* · )?TF not imported")  # the published reply
    assert notebook.page.sidebar.locator(".tfgpu-frameworks, .tfgpu-framework-figures").count() == 0
    title = "\n".join(notebook.kernel_title())
    assert not re.search("JAX|PyTorch|Keras", title), title


def test_jax_started_shows_its_line_its_figures_on_their_cards_and_what_it_can_no_longer_take(
        lab: Lab, notebook: Notebook) -> None:
    notebook.run_cell(1)
    kernel = lab.kernel(NOTEBOOK)
    try:
        kernel.ok(GPU_STATS % POOL_LIMIT)
        notebook.run_cell(2)
        version = kernel.evaluate("__import__('jax').__version__")
        reply = wait_until(notebook.reply_with_jax_figures, 30, "JAX's figures of two devices published")
        said = kernel.ok("%tfgpu memory").output
    finally:
        kernel.close()
    frameworks = reply["frameworks"]
    jax = frameworks["jax"]
    assert (jax["state"], jax["version"]) == ("started", version)
    assert frameworks["keras"] == {"backend": "jax", "source": "KERAS_BACKEND"} and frameworks["torch"] is None
    # the record is what the kernel's own `%tfgpu memory` says
    published = framework_lines(figure_rows(frameworks, True))
    assert [line for line in said.splitlines() if line.startswith("JAX ")] == published
    cards = {gpu["uuid"] for gpu in lab.gpus()["gpus"]}
    assert [row["card"] in cards for row in jax["memory"]] == [True, True]
    assert jax["memory"][0]["card"] != jax["memory"][1]["card"] and jax["memory"][1]["current"] > 0

    expected_rows = framework_rows(views_of(frameworks), growth=reply["policy"]["growth"] is True)
    assert [label for label, _ in expected_rows] == ["JAX", "Keras"]
    assert notebook.framework_rows_once(expected_rows) == expected_rows
    for row in jax["memory"]:  # on its own card, as `%tfgpu memory` words it there (the card goes without saying)
        assert notebook.card_figures(row["card"]) == [f"{line_of('jax', row, False)} ← this notebook"]

    locked = [change for change in reply["pending"] if change["why"] == "jax_backends"]
    assert locked and all(change["needs_restart"] for change in locked)
    worded = [change_text(Change(c["setting"], c["device"], c["now"], c["wanted"], c["why"])) for c in locked]
    assert "XLA_PYTHON_CLIENT_PREALLOCATE: unset → false (read when JAX's backends started)" in worded
    for title in (notebook.kernel_title(), (notebook.page.status.get_attribute("title") or "").splitlines()):
        assert "Pending, needs a restart:" in title and all(f"  - {line}" in title for line in worded), title
        assert all(f"{label}: {line}" in title for label, line in expected_rows), title
        assert set(published) <= set(title), title
    assert "restart pending" in notebook.page.status.inner_text()


def answering_kernel(reply: dict[str, Any]) -> Any:
    def answer(route: Any) -> None:
        route.fulfill(status=200, content_type="application/json", body=json.dumps(reply))

    return answer


def test_pytorch_started_keras_from_its_file_and_figures_without_a_card_are_worded_as_python_words_them(
        lab: Lab, notebook: Notebook) -> None:
    """A reply the schema accepts, for the same kernel: PyTorch's CUDA started with two memory fractions
    (growth has nothing to do there), its figures of one device on GPU 2, of two more on no card shown
    here; JAX not imported yet with what its import will bring; Keras's backend from keras.json."""
    gpus = lab.gpus()["gpus"]
    reply = copy.deepcopy(notebook.reply())
    reply["frameworks"] = {
        "jax": {"state": "not_imported", "version": None, "fractions": [], "memory": [],
                "variables": [{"name": "XLA_PYTHON_CLIENT_PREALLOCATE", "value": "false"}]},
        "torch": {"state": "started", "version": "2.13.0", "variables": [
                      {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "backend:cudaMallocAsync"},
                      {"name": "PYTORCH_ALLOC_CONF", "value": "backend:cudaMallocAsync"}],
                  "fractions": [{"device": 0, "fraction": 0.1}, {"device": 1, "fraction": 0.25}],
                  "memory": [{"device": "cuda:0", "card": gpus[2]["uuid"], "current": 2304 * MIB, "peak": None,
                              "reserved": 3 * GIB},
                             {"device": "cuda:1", "card": None, "current": 512 * MIB, "peak": None, "reserved": None},
                             {"device": "cuda:2", "card": "GPU-0badcafe-0000-4000-8000-000000000000",
                              "current": 0, "peak": None, "reserved": GIB}]},
        "keras": {"backend": "torch", "source": "keras.json"}}
    conforms(reply, "kernelReply")
    frameworks = reply["frameworks"]
    expected_rows = framework_rows(views_of(frameworks), growth=reply["policy"]["growth"] is True)
    assert any("growth: nothing to do" in line for _, line in expected_rows)  # the policy's growth reaches the words
    page = notebook.page.page
    matches = lambda url: f"/api/tfgpu/kernels/{notebook.kernel_id}" in url  # noqa: E731
    page.route(matches, answering_kernel(reply))
    try:
        assert notebook.framework_rows_once(expected_rows) == expected_rows
        torch = frameworks["torch"]["memory"]
        assert notebook.card_figures(gpus[2]["uuid"]) == [f"{line_of('torch', torch[0], False)} ← this notebook"]
        assert "PyTorch cuda:0: allocated 2.2 GiB, reserved 3.0 GiB" in line_of("torch", torch[0], False)
        unplaced = notebook.page.sidebar.locator(".tfgpu-framework-torch .tfgpu-framework-memory li")
        assert unplaced.all_inner_texts() == [line_of("torch", row, True) for row in torch[1:]]
        assert notebook.page.sidebar.locator(".tfgpu-framework-figure").count() == 1
        assert set(framework_lines(figure_rows(frameworks, True))) <= set(notebook.kernel_title())
    finally:
        page.unroute(matches)
