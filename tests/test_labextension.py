"""The JupyterLab extension (labextension/, built into tfgpu_magic/labextension/) in real JupyterLab and
Notebook 7, driven by headless Chromium through Playwright, against the server extension.

One JupyterLab serves the module (servers.py: 127.0.0.1, a token, throwaway Jupyter dirs). Its NVML is
the four fake cards (test_serverext.py's `write_fake_gpu_server_config`), and the test places the real
kernels' pids on them, as NVML lists a process that holds memory. The notebook's kernel loads tfgpu_magic
and sets a policy; what the status bar and sidebar say comes from what that kernel published and from
the server, never from asking the kernel. The tests go in order on one page: status item, sidebar,
a busy kernel, a change waiting for a restart, the restart command, a hostile notebook name and the
shutdown of an idle kernel, polling; then the sidebar and the command in Notebook 7.

Also here: the build is current and installed where JupyterLab finds it, and the TypeScript passes its
type check and lint (`npm run check`). Screenshots go to docs/ only with TFGPU_SCREENSHOTS=docs
(`make screenshots`). Needs Debian's chromium (`.ci/run` installs it) and node for the lint.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import nbformat
import pytest
from servers import JupyterServer, KernelConnection, await_new_kernel, isolated_jupyter, running_server, wait_until
from test_browser import KERNEL_READY, UI_TIMEOUT_MS, VIEWPORT, browser, notebook_session, screenshot_dir  # noqa: F401
from test_serverext import XSS_NOTEBOOK, place, write_fake_gpu_server_config

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "labextension"
BUILT = ROOT / "tfgpu_magic" / "labextension"
NAME = "tfgpu-magic"
COMMAND = "tfgpu:restart-run-to-selected"
COMMAND_LABEL = "Restart Kernel with the GPU Policy and Run up to Selected Cell…"
NOTEBOOK = "gpu.ipynb"
CELLS = ("x = 41", "%load_ext tfgpu_magic\n%tfgpu visible 1\n%tfgpu growth on", "import tensorflow as tf\ntf.constant(1)")
POLL_S = 3.0
"""The front end's poll period (labextension/src/index.ts `POLL_MS`)."""
CPU_COUNT = "len(__import__('tensorflow').config.list_logical_devices('CPU'))"
GIB = 1024


def npm_check() -> subprocess.CompletedProcess[str]:
    return subprocess.run(["npm", "run", "check"], cwd=SOURCE, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("npm") is None, reason="node and npm are not installed: no TypeScript check")
def test_the_typescript_passes_its_type_check_and_lint() -> None:
    assert (SOURCE / "node_modules").is_dir(), "labextension/node_modules is missing: `make test` installs it (npm ci)"
    checked = npm_check()
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-4000:]


def newest_source() -> float:
    return max(path.stat().st_mtime for path in [*SOURCE.glob("src/*.ts"), *SOURCE.glob("style/*"),
                                                   *SOURCE.glob("schema/*"), SOURCE / "package.json"])


def test_the_build_is_current_and_jupyterlab_lists_it_enabled_and_ok() -> None:
    built = BUILT / "package.json"
    assert built.is_file(), "tfgpu_magic/labextension is not built: `make test` builds it (setup.py)"
    assert built.stat().st_mtime >= newest_source(), "labextension/ changed since the build: `make test` rebuilds it"
    listed = subprocess.run([sys.executable, "-m", "jupyterlab.labextensions", "list"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    output = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    version = json.loads((SOURCE / "package.json").read_text())["version"]
    assert re.search(rf"{NAME} v{re.escape(version)} enabled\s+OK", output), output


# ----- one JupyterLab with the fake cards ----------------------------------------------------------------
def write_notebook(root: Path, name: str, cells: tuple[str, ...]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(code) for code in cells]
    nbformat.write(nb, str(root / name))


class Lab:
    """The server, the file that places pids on the fake cards, and what is placed."""

    def __init__(self, server: JupyterServer, placement: Path) -> None:
        self.server = server
        self.placement = placement
        self.placed: dict[int, tuple[int, int]] = {}

    def place(self, pid: int, gpu: int, mib: int) -> None:
        self.placed[pid] = (gpu, mib)
        place(self.placement, self.placed)

    def kernel(self, path: str = NOTEBOOK) -> KernelConnection:
        """A second client on notebook `path`'s kernel (the front end keeps its own)."""
        return self.server.connect(notebook_session(self.server, path)["kernel"]["id"])


@contextlib.contextmanager
def fake_gpu_env(prefix: str) -> Iterator[tuple[Any, Path]]:
    """A throwaway Jupyter env whose server sees the four fake cards; the notebooks written in it; no
    "get notified about Jupyter news?" toast over the sidebar."""
    with isolated_jupyter(prefix) as env:
        placement = env.root / "placement.json"
        write_fake_gpu_server_config(env.config_dir, placement)
        settings = env.config_dir / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
        write_notebook(env.root, NOTEBOOK, CELLS)
        write_notebook(env.root, XSS_NOTEBOOK, ("y = 1",))
        yield env, placement


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with fake_gpu_env("tfgpu-labext-") as (env, placement):
        with running_server(env, app="jupyterlab", extra_args=("--LabApp.expose_app_in_browser=True",)) as server:
            yield Lab(server, placement)


class Page:
    """A page on one notebook, and what it asked the server (`requests`: times of /api/tfgpu/ requests)."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.requests: list[tuple[float, str]] = []
        self.dialogs: list[str] = []
        page.on("request", self._seen)
        page.on("dialog", self._alert)

    def _seen(self, request: Any) -> None:
        if "/api/tfgpu/" in request.url:
            self.requests.append((time.monotonic(), request.url))

    def _alert(self, dialog: Any) -> None:  # alert(), confirm(): what an injected script would open
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def run(self, command: str, **args: Any) -> Any:
        return self.page.evaluate("([id, args]) => window.jupyterapp.commands.execute(id, args)", [command, args])

    @property
    def status(self) -> Any:
        return self.page.locator("#tfgpu-statusbar")

    @property
    def sidebar(self) -> Any:
        return self.page.locator("#tfgpu-sidebar")

    def status_says(self, pattern: str, timeout: float = 30) -> str:
        """The status item's text once it matches `pattern` (polled by the front end every 3 s)."""
        return wait_until(lambda: re.search(pattern, self.status.inner_text()) and self.status.inner_text(),
                          timeout, f"the status bar saying {pattern!r} (it says {self.status.inner_text()!r})")


def accept_dialog(page: Any, title: str) -> None:
    """Press the accept button of the dialog titled `title` (JupyterLab's own, e.g. its restart dialog)."""
    dialog = page.locator(".jp-Dialog", has_text=title)
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()


def open_notebook(browser: Any, url: str) -> Page:  # noqa: F811 (the fixture from test_browser)
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(UI_TIMEOUT_MS)
    opened = Page(page)
    page.goto(url)
    page.wait_for_function(KERNEL_READY, timeout=UI_TIMEOUT_MS)
    return opened


@pytest.fixture(scope="module")
def page(lab: Lab, browser: Any) -> Iterator[Page]:  # noqa: F811
    opened = open_notebook(browser, f"{lab.server.url}lab/tree/{NOTEBOOK}?reset&token={lab.server.token}")
    opened.run("notebook:run-all-cells")
    kernel = lab.kernel()
    try:
        wait_until(lambda: kernel.evaluate("bool('tf' in globals() and tf.constant(1).numpy() == 1)"), 120, "cells run")
        lab.place(kernel.pid(), 1, 2 * GIB)
    finally:
        kernel.close()
    yield opened
    opened.page.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshot_dir(os.environ, tmp_path_factory.mktemp("labextension-shots"))


def test_the_status_bar_names_the_kernels_gpus_policy_memory_and_tensorflow(page: Page, shots: Path) -> None:
    said = page.status_says(r"2\.0 / 80 GiB")  # once the server's fake cards list the kernel (placed just now)
    assert said == "GPU 1 · growth on · 2.0 / 80 GiB · TF initialized"
    title = page.status.get_attribute("title")
    assert "TensorFlow: initialized" in title and "by In [3]" in title and "visible 1" in title
    page.page.locator("#jp-main-statusbar").screenshot(path=str(shots / "labextension-statusbar.png"))


def test_a_click_opens_the_sidebar_with_a_card_per_gpu_and_this_notebook_marked(page: Page, shots: Path) -> None:
    page.status.click()
    cards = page.sidebar.locator(".tfgpu-gpu-card")
    wait_until(lambda: cards.count() == 4, 30, "four GPU cards")
    assert [cards.nth(i).locator(".tfgpu-gpu-title").inner_text() for i in range(4)] == [
        "GPU 0 · A100-SXM4-80GB", "GPU 1 · A100-SXM4-80GB", "GPU 2 · A100-SXM4-80GB", "GPU 3 · A100-SXM4-40GB"]
    assert cards.nth(0).locator(".tfgpu-gpu-figures").inner_text() == "20.0 / 80 GiB · 50% busy"
    assert cards.nth(1).locator(".tfgpu-gpu-figures").inner_text() == "3.0 / 80 GiB · 30% busy"  # 1 GiB + this 2 GiB
    this = cards.nth(1).locator(".tfgpu-this")
    assert re.fullmatch(rf"{re.escape(NOTEBOOK)} · 2\.0 GiB · idle \d+[smh]\S* · TF initialized ← this notebook",
                        this.inner_text().strip()), this.inner_text()
    assert "pid 4242 · ? · 19.0 GiB" in cards.nth(0).inner_text()  # another process: pid, user, memory only
    assert "MIG ×2" in cards.nth(3).inner_text()
    assert page.sidebar.locator(".tfgpu-kernel").inner_text().startswith("This notebook: GPU 1 · growth on")
    page.sidebar.screenshot(path=str(shots / "labextension-sidebar.png"))


def test_a_busy_kernel_still_shows_its_policy_and_memory(lab: Lab, page: Page) -> None:
    """While `time.sleep(30)` runs, the memory the card reports changes, and the status follows it."""
    kernel = lab.kernel()
    try:
        pid = kernel.pid()
        kernel_id = kernel.kernel_id
        kernel.client.execute("import time; time.sleep(30)")
        wait_until(lambda: lab.server.request("GET", f"api/kernels/{kernel_id}")["execution_state"] == "busy",
                   30, "the kernel busy")
        lab.place(pid, 1, 3 * GIB)
        assert page.status_says(r"3\.0 / 80 GiB") == "GPU 1 · growth on · 3.0 / 80 GiB · TF initialized"
        assert lab.server.request("GET", f"api/kernels/{kernel_id}")["execution_state"] == "busy"
        assert "busy" in page.sidebar.locator(".tfgpu-this").inner_text()
        lab.server.request("POST", f"api/kernels/{kernel_id}/interrupt")
        wait_until(lambda: lab.server.request("GET", f"api/kernels/{kernel_id}")["execution_state"] == "idle",
                   30, "the kernel idle again")
    finally:
        kernel.close()


def test_a_change_that_needs_a_restart_marks_the_status(lab: Lab, page: Page) -> None:
    kernel = lab.kernel()
    try:
        kernel.ok("%tfgpu split cpu 2")
    finally:
        kernel.close()
    said = page.status_says("restart pending")
    assert said == ("GPU 1 · growth on, split cpu into 2 logical devices · 3.0 / 80 GiB · TF initialized"
                    " · restart pending")
    assert "tfgpu-pending" in page.status.get_attribute("class")
    assert "logical CPU devices: TF default → 2 logical devices" in page.status.get_attribute("title")


def test_the_restart_command_brings_back_the_work_with_the_new_policy_in_force(lab: Lab, page: Page) -> None:
    """From the Kernel menu, with the TensorFlow cell selected: JupyterLab's own restart dialog, then the
    new kernel has cell 1's variable and the split that was waiting for the restart."""
    kernel = lab.kernel()
    old_pid = kernel.pid()
    page.page.evaluate("() => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = 2; }")
    page.page.get_by_role("menuitem", name="Kernel", exact=True).click()
    page.page.get_by_role("menuitem", name=COMMAND_LABEL).click()
    accept_dialog(page.page, "Restart Kernel?")
    kernel = await_new_kernel(kernel, old_pid, timeout=90)
    try:
        wait_until(lambda: kernel.evaluate("globals().get('x')") == 41, 120, "cell 1 run again")
        wait_until(lambda: kernel.evaluate("bool('tf' in globals() and tf.constant(1).numpy() == 1)"), 120, "cell 3 run")
        assert kernel.evaluate(CPU_COUNT) == 2
        lab.place(kernel.pid(), 1, 2 * GIB)
    finally:
        kernel.close()
    said = page.status_says(r"2\.0 / 80 GiB · TF initialized$", timeout=60)
    assert said == "GPU 1 · growth on, split cpu into 2 logical devices · 2.0 / 80 GiB · TF initialized"


def test_the_command_is_in_the_palette(page: Page) -> None:
    page.page.keyboard.press("Control+Shift+C")
    page.page.keyboard.type("GPU Policy")
    assert page.page.locator(".lm-CommandPalette-item", has_text=COMMAND_LABEL).count() == 1
    page.page.keyboard.press("Escape")


def test_a_hostile_notebook_name_shows_as_text_and_its_idle_kernel_can_be_shut_down(lab: Lab, page: Page) -> None:
    session = lab.server.request("POST", "api/sessions", {"path": XSS_NOTEBOOK, "name": XSS_NOTEBOOK,
                                                          "type": "notebook", "kernel": {"name": "python3"}})
    kernel = lab.server.connect(session["kernel"]["id"])
    try:
        lab.place(kernel.pid(), 2, 512)
    finally:
        kernel.close()
    row = page.sidebar.locator(".tfgpu-gpu-card").nth(2).locator(".tfgpu-process")
    wait_until(lambda: XSS_NOTEBOOK in row.inner_text(), 30, "the notebook's row on GPU 2")
    assert page.sidebar.locator("img").count() == 0 and page.dialogs == []
    row.get_by_role("button", name="Shut down").click()
    dialog = page.page.locator(".jp-Dialog")
    assert XSS_NOTEBOOK in dialog.inner_text() and dialog.locator("img").count() == 0
    accept_dialog(page.page, "Shut down kernel?")
    wait_until(lambda: session["kernel"]["id"] not in [k["id"] for k in lab.server.kernels()], 30, "the kernel gone")
    assert page.dialogs == []


def polls_in(page: Page, seconds: float) -> list[float]:
    """Start times of the requests the page sends to /api/tfgpu/ during the next `seconds`."""
    start = time.monotonic()
    page.page.wait_for_timeout(seconds * 1000)
    return [at for at, _ in page.requests if at >= start]


MIN_POLL_S = 2.0
"""The shortest gap between two poll rounds the issue allows ("every 2-5 s")."""


def poll_rounds(starts: list[float]) -> list[float]:
    """The start of each poll round: the kernel and the GPUs are asked together, their requests a moment
    apart (more under load), so requests under a second after the previous one belong to its round."""
    rounds: list[float] = []
    last = None
    for at in sorted(starts):
        if last is None or at - last >= 1.0:
            rounds.append(at)
        last = at
    return rounds


def test_it_polls_every_few_seconds_only_while_the_page_is_visible(page: Page) -> None:
    seen = polls_in(page, 2.5 * POLL_S)
    assert seen, "no poll while the page is visible"
    rounds = poll_rounds(seen)
    assert all(later - earlier >= MIN_POLL_S for earlier, later in zip(rounds, rounds[1:])), seen
    page.page.evaluate("""() => {
      Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'});
      document.dispatchEvent(new Event('visibilitychange'));
    }""")
    try:
        assert polls_in(page, 2.5 * POLL_S) == []
    finally:
        page.page.evaluate("""() => {
          delete document.visibilityState;
          document.dispatchEvent(new Event('visibilitychange'));
        }""")
    assert wait_until(lambda: polls_in(page, 0.5), 10, "polling again once visible")


def test_with_no_notebook_open_and_the_sidebar_closed_nothing_is_asked(page: Page) -> None:
    """Last on this page: it closes the notebook (saved first, so no dialog asks)."""
    page.run("docmanager:save")
    page.run("application:close-all")
    page.page.evaluate("() => window.jupyterapp.shell.collapseRight()")
    page.page.wait_for_timeout(1000)
    assert polls_in(page, 2.5 * POLL_S) == []
    assert not page.status.is_visible()


def test_notebook_7_has_the_sidebar_and_the_restart_command(browser: Any) -> None:  # noqa: F811
    """No status bar there; the sidebar (opened as the status item would) and the command from the Kernel
    menu work, the policy kept across the restart (growth on, checked without TensorFlow)."""
    pytest.importorskip("notebook", minversion="7")
    with fake_gpu_env("tfgpu-labext-nb7-") as (env, placement):
        write_notebook(env.root, NOTEBOOK, CELLS[:2])
        expose = "--JupyterNotebookApp.expose_app_in_browser=True"
        with running_server(env, app="notebook", extra_args=(expose,)) as server:
            page = open_notebook(browser, f"{server.url}notebooks/{NOTEBOOK}?token={server.token}")
            try:
                page.run("notebook:run-all-cells")
                kernel = server.connect(notebook_session(server, NOTEBOOK)["kernel"]["id"])
                wait_until(lambda: kernel.evaluate("globals().get('x')") == 41, 60, "cells run")
                old_pid = kernel.pid()
                place(placement, {old_pid: (1, 2 * GIB)})
                assert page.status.count() == 0
                page.page.evaluate("() => window.jupyterapp.shell.activateById('tfgpu-sidebar')")
                cards = page.sidebar.locator(".tfgpu-gpu-card")
                wait_until(lambda: cards.count() == 4, 30, "four GPU cards")
                wait_until(lambda: "← this notebook" in cards.nth(1).inner_text(), 30, "this notebook on GPU 1")
                assert page.sidebar.locator(".tfgpu-kernel").inner_text().startswith("This notebook: GPU 1 · growth on")
                kernel.ok("x = 0")
                page.page.evaluate("() => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = 1; }")
                page.page.get_by_role("menuitem", name="Kernel", exact=True).click()
                page.page.get_by_role("menuitem", name=COMMAND_LABEL).click()
                accept_dialog(page.page, "Restart Kernel?")
                kernel = await_new_kernel(kernel, old_pid, timeout=90)
                wait_until(lambda: kernel.evaluate("globals().get('x')") == 41, 60, "cell 1 run again")
                assert kernel.evaluate("__import__('tfgpu_magic').current_policy().growth") is True
                assert kernel.evaluate("__import__('os').environ.get('CUDA_VISIBLE_DEVICES')") == "1"
                kernel.close()
            finally:
                page.page.close()
