"""The JupyterLab extension (labextension/, built into tfgpu_magic/labextension/) in real JupyterLab and
Notebook 7, driven by headless Chromium through Playwright, against the server extension.

One JupyterLab serves most of the module (servers.py: 127.0.0.1, a token, throwaway Jupyter dirs). Its
NVML is the four fake cards (test_serverext.py's `write_fake_gpu_server_config`), and the test places
the real kernels' pids on them, as NVML lists a process that holds memory. The notebook's kernel loads
tfgpu_magic and sets a policy; what the status bar and sidebar say comes from what that kernel published
and from the server, never from asking the kernel. Sizes on the page are compared with what
tfgpu_magic/language/sizes.py writes for the same bytes. The tests go in order on one page: status item,
sidebar, a busy kernel, a change waiting for a restart, the restart command, a hostile notebook name,
focus and the keyboard across polls, the shutdown of an idle kernel, a failed poll and a server gone
(Playwright answers /api/tfgpu/ with 500, or drops it), polling; then, on a second notebook, the restart
while a cell sleeps (in Python, in C) measured against JupyterLab's own restart, and Cancel keeping
nothing. Then servers of their own: no NVIDIA driver (this machine), NVML with no card, and the error
codes this machine cannot produce (replies the schema accepts, answered by Playwright; one server for
these two); and the sidebar and command in Notebook 7. The server extension off comes first and last: its
page opens in the module's first test and its requests are counted over a minute in the last, the minute
passing while the others run.

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
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import nbformat
import pytest
from servers import JupyterServer, KernelConnection, await_new_kernel, isolated_jupyter, running_server, wait_until
from test_browser import KERNEL_READY, UI_TIMEOUT_MS, VIEWPORT, browser, notebook_session, screenshot_dir  # noqa: F401
from test_serverext import XSS_NOTEBOOK, conforms, place, write_fake_gpu_server_config

from tfgpu_magic.jupyter.kernelstate import policy_record
from tfgpu_magic.language.directives import describe_policy
from tfgpu_magic.language.policy import Policy
from tfgpu_magic.language.sizes import MIB, bytes_text, gib_pair
from tfgpu_magic.language.words import ALL_GPUS
from tfgpu_magic.serverext.gather import GPUS_STAMP, KERNEL_STAMP
from tfgpu_magic.serverext.history import SAMPLE_SECONDS, empty_reply

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "labextension"
BUILT = ROOT / "tfgpu_magic" / "labextension"
NAME = "tfgpu-magic"
PLUGIN = "plugin"
COMMAND = "tfgpu:restart-run-to-selected"
COMMAND_LABEL = "Restart Kernel with the GPU Policy and Run up to Selected Cell…"
NOTEBOOK = "gpu.ipynb"
CELLS = ("x = 41", "%load_ext tfgpu_magic\n%tfgpu visible 1\n%tfgpu growth on", "import tensorflow as tf\ntf.constant(1)")
SLEEPER = "sleep.ipynb"
SLEEPS = {"python": "import time; time.sleep(120)", "c": "import ctypes; ctypes.CDLL(None).sleep(120)"}
SLEEPER_CELLS = ("x = 41", "%load_ext tfgpu_magic\n%tfgpu growth on", SLEEPS["python"], SLEEPS["c"])
OTHER = "other.ipynb"
OTHER_KERNEL = "notpython"
POLL_S = 3.0
"""The front end's default refresh rate (labextension/schema/plugin.json `refreshRate`)."""
FAILING_CAP = 6
"""At most this many requests a minute while the server does not answer (model.ts, FAILING_BUDGET)."""
CPU_COUNT = "len(__import__('tensorflow').config.list_logical_devices('CPU'))"
GIB = 1024
TIE_MIB = 2304
"""2.25 GiB: Python writes a tie to the even digit (`2.2 GiB`), JavaScript's `toFixed` up (`2.3`)."""
EXTENSION_OFF = "The tfgpu_magic server extension is off or not installed"
EXTENSION_FIX = "jupyter server extension enable tfgpu_magic.serverext"
NOTEBOOK_READY = """(path) => {
  const widget = window.jupyterapp.shell.currentWidget;
  const kernel = widget && widget.context && widget.context.path === path && widget.sessionContext.session
    && widget.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle';
}"""
"""The current tab is notebook `path`, its kernel idle (test_browser's KERNEL_READY, for one notebook)."""
NO_POLICY_KEPT = "(lambda m: m is None or m.current_policy().growth is None)(__import__('sys').modules.get('tfgpu_magic'))"
"""In a kernel: no tfgpu policy (the extension not loaded, or loaded with growth unset)."""


# ----- first: the server extension off (its minute of requests passes while the other tests run) -------
@pytest.fixture(scope="module")
def extension_off(browser: Any) -> Iterator[tuple[JupyterServer, Page]]:  # noqa: F811
    """A JupyterLab whose config turns the server extension off, its page on a notebook polling at the
    fastest rate the settings allow (1 s). Set up by the module's first test and left open to its end, where
    the page's requests are counted over the minute from its first, which has passed meanwhile (Playwright's
    Chromium does not slow the timers of a page in the background: `--disable-background-timer-throttling`,
    https://github.com/microsoft/playwright/blob/main/packages/playwright-core/src/server/chromium/chromiumSwitches.ts)."""
    with lab_env("tfgpu-labext-off-") as env:
        (env.config_dir / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": {"jpserver_extensions": {"tfgpu_magic.serverext": False}}}))
        write_lab_settings(env.config_dir, NAME, PLUGIN, {"refreshRate": 1000})
        write_notebook(env.root, NOTEBOOK, ("x = 1",))
        with jupyterlab(env) as server:
            page = open_page(browser, lab_url(server, NOTEBOOK))
            try:
                yield server, page
            finally:
                page.page.close()


def test_with_the_server_extension_off_it_says_so_and_the_command_is_jupyterlabs_own(
        extension_off: tuple[JupyterServer, Page], shots: Path) -> None:
    """The sidebar and the status item say the extension is off with the fix, the command falls back to
    JupyterLab's own (its caption says why); the sidebar's ask and the command fall in the minute whose
    requests the module's last test counts."""
    server, page = extension_off
    with pytest.raises(Exception, match="404"):
        server.request("GET", "api/tfgpu/gpus")
    said = page.status_says("GPU: server extension off")
    assert EXTENSION_OFF in page.status.get_attribute("title")
    page.page.locator("#jp-main-statusbar").screenshot(path=str(shots / "labextension-error-extension-off-status.png"))
    page.open_sidebar()  # asks on demand, within the cap
    text = page.sidebar_says(re.escape(EXTENSION_OFF))
    assert EXTENSION_FIX in text and said
    page.sidebar.screenshot(path=str(shots / "labextension-error-extension-off.png"))
    assert "No GPU policy is kept (the tfgpu_magic server extension is off)" in page.caption()
    page.start(COMMAND)  # JupyterLab's own restart-and-run: its dialog, without our policy words
    dialog = page.page.locator(".jp-Dialog", has_text="Restart Kernel?")
    dialog.wait_for(state="visible")
    assert "GPU policy" not in dialog.inner_text()
    dialog.locator(".jp-Dialog-button.jp-mod-reject").click()


def npm_check() -> subprocess.CompletedProcess[str]:
    return subprocess.run(["npm", "run", "check"], cwd=SOURCE, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("npm") is None, reason="node and npm are not installed: no TypeScript check")
def test_the_typescript_passes_its_type_check_and_lint() -> None:
    assert (SOURCE / "node_modules").is_dir(), "labextension/node_modules is missing: `make test` installs it (npm ci)"
    checked = npm_check()
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-4000:]


def newest_source() -> float:
    return max(path.stat().st_mtime for path in [*SOURCE.glob("src/*.ts"), *SOURCE.glob("src/*.tsx"),
                                                   *SOURCE.glob("style/*"), *SOURCE.glob("schema/*"),
                                                   SOURCE / "package.json"])


def test_the_build_is_current_and_jupyterlab_lists_it_enabled_and_ok() -> None:
    built = BUILT / "package.json"
    assert built.is_file(), "tfgpu_magic/labextension is not built: `make test` builds it (pip install -e ., hatch-jupyter-builder)"
    assert built.stat().st_mtime >= newest_source(), "labextension/ changed since the build: `make test` rebuilds it"
    listed = subprocess.run([sys.executable, "-m", "jupyterlab.labextensions", "list"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    output = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    version = json.loads((SOURCE / "package.json").read_text())["version"]
    assert re.search(rf"{NAME} v{re.escape(version)} enabled\s+OK", output), output


def test_the_refresh_rate_is_a_setting_with_a_floor() -> None:
    """The settings schema JupyterLab's settings editor shows (built with the extension)."""
    schema = json.loads((BUILT / "schemas" / NAME / f"{PLUGIN}.json").read_text())
    rate = schema["properties"]["refreshRate"]
    assert (rate["type"], rate["default"], rate["minimum"]) == ("integer", int(POLL_S * 1000), 1000)


# ----- sizes as Python writes them -------------------------------------------------------------------
def mib(count: float) -> float:
    """Bytes of a reply as the MiB count the Python side hands `gib_pair` (whole where whole)."""
    value = count / MIB
    return int(value) if value.is_integer() else value


def python_pair(used: float, total: float) -> str:
    """`sizes.gib_pair` on a reply's bytes."""
    return gib_pair(mib(used), mib(total))


# ----- Jupyter environments and servers ---------------------------------------------------------------
def write_notebook(root: Path, name: str, cells: tuple[str, ...], kernel: str = "python3") -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(code) for code in cells]
    nbformat.write(nb, str(root / name))


def write_other_language_kernelspec(env: Any) -> None:
    """Kernelspec `OTHER_KERNEL`: its spec names another language (what the front end reads to tell a
    Python kernel); its process is an ipykernel, so the test can ask it its pid."""
    folder = env.write_kernelspec(OTHER_KERNEL)
    spec = json.loads((folder / "kernel.json").read_text())
    (folder / "kernel.json").write_text(json.dumps({**spec, "language": "julia"}))


def write_lab_settings(config_dir: Path, package: str, plugin: str, values: dict[str, Any]) -> None:
    """User settings of a JupyterLab plugin, as the settings editor saves them."""
    folder = config_dir / "lab" / "user-settings" / package
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{plugin}.jupyterlab-settings").write_text(json.dumps(values))


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

    def gpus(self) -> dict[str, Any]:
        """`GET /api/tfgpu/gpus` as the page gets it, checked against the schema."""
        return conforms(self.server.request("GET", "api/tfgpu/gpus"), "gpusReply")

    def pending_files(self) -> list[str]:
        """Policies kept for a next kernel (`jupyter/persist.py`: `tfgpu-pending-*` in the runtime dir)."""
        return sorted(path.name for path in self.server.env.runtime_dir.glob("tfgpu-pending-*"))


@contextlib.contextmanager
def lab_env(prefix: str) -> Iterator[Any]:
    """A throwaway Jupyter env without the "get notified about Jupyter news?" toast over the sidebar."""
    with isolated_jupyter(prefix) as env:
        write_lab_settings(env.config_dir, "@jupyterlab/apputils-extension", "notification", {"fetchNews": "false"})
        yield env


@contextlib.contextmanager
def fake_gpu_env(prefix: str) -> Iterator[tuple[Any, Path]]:
    """An env whose server sees the four fake cards; the notebooks written in it."""
    with lab_env(prefix) as env:
        placement = env.root / "placement.json"
        write_fake_gpu_server_config(env.config_dir, placement)
        write_notebook(env.root, NOTEBOOK, CELLS)
        write_notebook(env.root, XSS_NOTEBOOK, ("y = 1",))
        write_notebook(env.root, SLEEPER, SLEEPER_CELLS)
        write_other_language_kernelspec(env)
        write_notebook(env.root, OTHER, ("y = 1",), kernel=OTHER_KERNEL)
        yield env, placement


def jupyterlab(env: Any) -> Any:
    return running_server(env, app="jupyterlab", extra_args=("--LabApp.expose_app_in_browser=True",))


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with fake_gpu_env("tfgpu-labext-") as (env, placement), jupyterlab(env) as server:
        yield Lab(server, placement)


class Page:
    """A page, and what it asked the server (`requests`: times of /api/tfgpu/ requests)."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.requests: list[tuple[float, str]] = []
        """When Python heard of each (monotonic: while it waits in Playwright, at once), and its URL."""
        self.sent: list[Any] = []
        """The same requests, as Playwright's `Request`s (their timing is the browser's)."""
        self.dialogs: list[str] = []
        page.on("request", self._seen)
        page.on("dialog", self._alert)

    def _seen(self, request: Any) -> None:
        if "/api/tfgpu/" in request.url:
            self.requests.append((time.monotonic(), request.url))
            self.sent.append(request)

    def sent_at(self) -> list[float | None]:
        """When the page sent each request to /api/tfgpu/ heard of so far, in seconds since the epoch by the
        browser's clock (Playwright's timing, known with the response: waited for); None where no response
        came."""
        return [request.timing["startTime"] / 1000 if request.response() is not None else None
                for request in self.sent]

    def _alert(self, dialog: Any) -> None:  # alert(), confirm(): what an injected script would open
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def run(self, command: str, **args: Any) -> Any:
        """Run a JupyterLab command and wait for it to finish."""
        return self.page.evaluate("([id, args]) => window.jupyterapp.commands.execute(id, args)", [command, args])

    def start(self, command: str, **args: Any) -> None:
        """Start a JupyterLab command without waiting for it (it may wait for a dialog, or a cell)."""
        self.page.evaluate("([id, args]) => { window.jupyterapp.commands.execute(id, args); }", [command, args])

    def caption(self, command: str = COMMAND) -> str:
        return self.page.evaluate("(id) => window.jupyterapp.commands.caption(id)", command)

    def select_cell(self, index: int) -> None:
        self.page.evaluate("(i) => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = i; }", index)

    def open_sidebar(self) -> None:
        self.page.evaluate("() => window.jupyterapp.shell.activateById('tfgpu-sidebar')")

    @property
    def status(self) -> Any:
        return self.page.locator("#tfgpu-statusbar")

    @property
    def sidebar(self) -> Any:
        return self.page.locator("#tfgpu-sidebar")

    def status_says(self, pattern: str, timeout: float = 30) -> str:
        """The status item's text once it matches `pattern`."""
        return wait_until(lambda: re.search(pattern, self.status.inner_text()) and self.status.inner_text(),
                          timeout, f"the status bar saying {pattern!r} (it says {self.status.inner_text()!r})")

    def sidebar_says(self, pattern: str, timeout: float = 30) -> str:
        """The sidebar's text once it matches `pattern`."""
        return wait_until(lambda: re.search(pattern, self.sidebar.inner_text()) and self.sidebar.inner_text(),
                          timeout, f"the sidebar saying {pattern!r} (it says {self.sidebar.inner_text()!r})")

    def polls_after(self, count: int, since: float, timeout: float = 30) -> None:
        """Wait until the page sent `count` requests to /api/tfgpu/ after `since` (monotonic). Waits in
        Playwright (its events, which `requests` records, arrive only while it runs)."""
        def seen() -> bool:
            self.page.wait_for_timeout(100)
            return len([at for at, _ in self.requests if at > since]) >= count

        wait_until(seen, timeout, f"{count} requests to /api/tfgpu/")


def accept_dialog(page: Any, title: str) -> None:
    """Press the accept button of the dialog titled `title` (JupyterLab's own, e.g. its restart dialog)."""
    dialog = page.locator(".jp-Dialog", has_text=title)
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()


def open_page(browser: Any, url: str, kernel: bool = True) -> Page:  # noqa: F811 (the fixture from test_browser)
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(UI_TIMEOUT_MS)
    opened = Page(page)
    page.goto(url)
    if kernel:
        page.wait_for_function(KERNEL_READY, timeout=UI_TIMEOUT_MS)
    page.locator("#tfgpu-sidebar").wait_for(state="attached")  # the extension is active
    return opened


def lab_url(server: JupyterServer, path: str | None = None) -> str:
    return f"{server.url}lab{f'/tree/{path}' if path else ''}?reset&token={server.token}"


@pytest.fixture(scope="module")
def page(lab: Lab, browser: Any) -> Iterator[Page]:  # noqa: F811
    opened = open_page(browser, lab_url(lab.server, NOTEBOOK))
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


# ----- the status item and the sidebar ------------------------------------------------------------------
def test_the_status_bar_names_the_kernels_gpus_policy_memory_and_tensorflow(page: Page, shots: Path) -> None:
    pair = python_pair(2 * GIB * MIB, 80 * GIB * MIB)
    said = page.status_says(re.escape(pair))  # once the server's fake cards list the kernel (placed just now)
    assert said == f"GPU 1 · growth on · {pair} · TF initialized"
    title = page.status.get_attribute("title")
    assert "TensorFlow: initialized by In [3]: tf.constant(1)" in title and "Policy: visible 1, growth on" in title
    assert page.status.get_attribute("role") == "button" and said in page.status.get_attribute("aria-label")
    page.page.locator("#jp-main-statusbar").screenshot(path=str(shots / "labextension-statusbar.png"))


def test_a_click_opens_the_sidebar_with_a_card_per_gpu_and_this_notebook_marked(lab: Lab, page: Page, shots: Path) -> None:
    page.status.click()
    cards = page.sidebar.locator(".tfgpu-gpu-card")
    wait_until(lambda: cards.count() == 4, 30, "four GPU cards")
    assert [cards.nth(i).locator(".tfgpu-gpu-title").inner_text() for i in range(4)] == [
        "GPU 0 · A100-SXM4-80GB", "GPU 1 · A100-SXM4-80GB", "GPU 2 · A100-SXM4-80GB", "GPU 3 · A100-SXM4-40GB"]
    gpus = lab.gpus()["gpus"]
    figures = [cards.nth(i).locator(".tfgpu-gpu-figures").inner_text() for i in range(2)]
    assert figures == [f"{python_pair(gpu['memory_used'], gpu['memory_total'])} · {gpu['utilization']}% busy"
                       for gpu in gpus[:2]]
    assert figures == ["20.0 / 80 GiB · 50% busy", "3.0 / 80 GiB · 30% busy"]  # 1 GiB + this 2 GiB on GPU 1
    this = cards.nth(1).locator(".tfgpu-this .tfgpu-process-text")  # the row, without its chart (test_labext_history.py)
    own = bytes_text(2 * GIB * MIB)
    assert re.fullmatch(rf"{re.escape(NOTEBOOK)} · {re.escape(own)} · idle \d+[smh]\S* · TF initialized ← this notebook",
                        this.inner_text().strip()), this.inner_text()
    other = next(proc for proc in gpus[0]["processes"] if proc["kernel"] is None and proc["user"] is None)
    assert f"pid {other['pid']} · ? · {bytes_text(other['gpu_memory'])}" in cards.nth(0).inner_text()  # pid, user, memory
    assert "MIG ×2" in cards.nth(3).inner_text()
    assert page.sidebar.locator(".tfgpu-kernel").inner_text().startswith("This notebook: GPU 1 · growth on")
    assert page.sidebar.locator(".tfgpu-problem").count() == 0
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
        pair = python_pair(3 * GIB * MIB, 80 * GIB * MIB)
        assert page.status_says(re.escape(pair)) == f"GPU 1 · growth on · {pair} · TF initialized"
        assert lab.server.request("GET", f"api/kernels/{kernel_id}")["execution_state"] == "busy"
        wait_until(lambda: "busy" in page.sidebar.locator(".tfgpu-this").inner_text(), 30, "this kernel busy")
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
    pair = python_pair(3 * GIB * MIB, 80 * GIB * MIB)
    assert said == f"GPU 1 · growth on, split cpu into 2 logical devices · {pair} · TF initialized · restart pending"
    assert "tfgpu-pending" in page.status.get_attribute("class")
    title = page.status.get_attribute("title")
    assert "Pending, needs a restart:" in title and "logical CPU devices: TF default → 2 logical devices" in title


def test_the_restart_command_brings_back_the_work_with_the_new_policy_in_force(lab: Lab, page: Page) -> None:
    """From the Kernel menu, with the TensorFlow cell selected: a restart dialog that names the policy,
    then the new kernel has cell 1's variable and the split that was waiting for the restart."""
    kernel = lab.kernel()
    old_pid = kernel.pid()
    assert page.caption().startswith("Store the GPU policy this kernel published for the new kernel")
    page.select_cell(2)
    page.page.get_by_role("menuitem", name="Kernel", exact=True).click()
    page.page.get_by_role("menuitem", name=COMMAND_LABEL).click()
    dialog = page.page.locator(".jp-Dialog", has_text="Restart Kernel?")
    assert "GPU policy (visible 1, growth on, split cpu into 2 logical devices)" in dialog.inner_text()
    accept_dialog(page.page, "Restart Kernel?")
    kernel = await_new_kernel(kernel, old_pid, timeout=90)
    try:
        wait_until(lambda: kernel.evaluate("globals().get('x')") == 41, 120, "cell 1 run again")
        wait_until(lambda: kernel.evaluate("bool('tf' in globals() and tf.constant(1).numpy() == 1)"), 120, "cell 3 run")
        assert kernel.evaluate(CPU_COUNT) == 2
        lab.place(kernel.pid(), 1, 2 * GIB)
    finally:
        kernel.close()
    pair = python_pair(2 * GIB * MIB, 80 * GIB * MIB)
    said = page.status_says(rf"{re.escape(pair)} · TF initialized$", timeout=60)
    assert said == f"GPU 1 · growth on, split cpu into 2 logical devices · {pair} · TF initialized"


def test_the_command_is_in_the_palette(page: Page) -> None:
    page.page.keyboard.press("Control+Shift+C")
    page.page.keyboard.type("GPU Policy")
    assert page.page.locator(".lm-CommandPalette-item", has_text=COMMAND_LABEL).count() == 1
    page.page.keyboard.press("Escape")


def test_a_hostile_notebook_name_shows_as_text_and_sizes_read_as_python_writes_them(lab: Lab, page: Page) -> None:
    """The notebook `<img src=x onerror=alert(1)>.ipynb` holds 2.25 GiB on GPU 2: a tie that Python's
    rounding writes `2.2 GiB` (and the card `3.2 / 80 GiB`), where JavaScript's `toFixed` would say 2.3."""
    session = lab.server.request("POST", "api/sessions", {"path": XSS_NOTEBOOK, "name": XSS_NOTEBOOK,
                                                          "type": "notebook", "kernel": {"name": "python3"}})
    kernel = lab.server.connect(session["kernel"]["id"])
    try:
        lab.place(kernel.pid(), 2, TIE_MIB)
    finally:
        kernel.close()
    card = page.sidebar.locator(".tfgpu-gpu-card").nth(2)
    row = card.locator(".tfgpu-process")
    wait_until(lambda: XSS_NOTEBOOK in row.inner_text() and "Shut down" in row.inner_text(), 30,
               "the notebook's row on GPU 2, idle")
    assert page.sidebar.locator("img").count() == 0 and page.dialogs == []
    held = bytes_text(TIE_MIB * MIB)
    assert held == "2.2 GiB" and f"{XSS_NOTEBOOK} · {held} · idle" in row.inner_text()
    gpu = lab.gpus()["gpus"][2]
    assert card.locator(".tfgpu-gpu-figures").inner_text().startswith(
        python_pair(gpu["memory_used"], gpu["memory_total"]) + " · ")
    assert python_pair(gpu["memory_used"], gpu["memory_total"]) == "3.2 / 80 GiB"


def test_a_focused_button_keeps_its_focus_across_polls_and_works_from_the_keyboard(lab: Lab, page: Page) -> None:
    """The XSS notebook's "Shut down" is focused, two polls pass, it still has the focus; Enter opens its
    dialog, which shuts the kernel down. The status item opens the sidebar with Space."""
    session = notebook_session(lab.server, XSS_NOTEBOOK)
    button = page.sidebar.get_by_role("button", name="Shut down")
    assert button.count() == 1
    assert button.get_attribute("aria-label") == f"Shut down the kernel of {XSS_NOTEBOOK}"
    labels = page.sidebar.locator("button").evaluate_all(
        "buttons => buttons.map(b => (b.getAttribute('aria-label') || b.textContent || '').trim())")
    assert labels and all(labels), labels
    button.focus()
    before = time.monotonic()
    page.polls_after(2 * 2, before)  # two rounds, each the kernel and the cards
    page.page.wait_for_function("() => document.querySelectorAll('.tfgpu-gpu-card').length === 4")
    assert button.evaluate("b => b === document.activeElement"), "the focused button lost its focus to a poll"
    page.page.keyboard.press("Enter")
    dialog = page.page.locator(".jp-Dialog", has_text="Shut down kernel?")
    dialog.wait_for(state="visible")
    assert XSS_NOTEBOOK in dialog.inner_text() and dialog.locator("img").count() == 0
    accept_dialog(page.page, "Shut down kernel?")
    wait_until(lambda: session["kernel"]["id"] not in [k["id"] for k in lab.server.kernels()], 30, "the kernel gone")
    assert page.dialogs == []
    page.page.evaluate("() => window.jupyterapp.shell.collapseRight()")
    assert not page.sidebar.is_visible()
    page.status.focus()
    page.page.keyboard.press(" ")
    page.sidebar.wait_for(state="visible")


@contextlib.contextmanager
def tfgpu_requests_answered(page: Page, handler: Callable[[Any], None]) -> Iterator[None]:
    """Playwright answers the page's requests to /api/tfgpu/ with `handler` (the server never sees them)."""
    def matches(url: str) -> bool:
        return "/api/tfgpu/" in url

    page.page.route(matches, handler)
    try:
        yield
    finally:
        page.page.unroute(matches, handler)


def stale_age(text: str) -> int | None:
    found = re.search(r"stale: (\d+) s old", text)
    return int(found.group(1)) if found else None


def assert_stale_and_back(page: Page, problem: str, shots: Path, name: str, handler: Callable[[Any], None]) -> None:
    """While `handler` answers: the sidebar names `problem`, the cards and the status keep their figures
    marked stale, the age counting up; afterwards the marks go."""
    cards = page.sidebar.locator(".tfgpu-gpu-card")
    wait_until(lambda: cards.count() == 4 and not page.sidebar.locator(".tfgpu-stale").count(), 30, "current cards")
    with tfgpu_requests_answered(page, handler):
        page.sidebar_says(re.escape(problem))
        wait_until(lambda: (stale_age(page.sidebar.locator(".tfgpu-cards").inner_text()) or 0) >= 3, 30,
                   "the cards' age counting up")
        assert cards.count() == 4 and "growth on" in page.sidebar.locator(".tfgpu-kernel").inner_text()
        assert stale_age(page.status.inner_text()) is not None, page.status.inner_text()
        assert problem in page.status.get_attribute("title")
        page.sidebar.screenshot(path=str(shots / name))
    wait_until(lambda: not page.sidebar.locator(".tfgpu-stale").count() and not page.sidebar.locator(
        ".tfgpu-problem").count(), 90, "current figures again once the server answers")
    assert stale_age(page.status.inner_text()) is None


def test_a_failed_poll_after_a_good_one_marks_the_figures_stale_with_their_age(page: Page, shots: Path) -> None:
    assert_stale_and_back(page, "The GPU request failed (HTTP 500).", shots, "labextension-error-failed.png",
                          lambda route: route.fulfill(status=500, content_type="application/json",
                                                      body='{"message": "Internal Server Error"}'))


def test_a_server_gone_is_said_and_the_figures_kept_stale(page: Page, shots: Path) -> None:
    assert_stale_and_back(page, "The Jupyter server does not answer.", shots, "labextension-error-server-gone.png",
                          lambda route: route.abort("connectionrefused"))


MIN_POLL_S = 2.0
"""The shortest gap this test accepts between two poll rounds at the default refresh (`POLL_S`): every few
seconds, never a burst."""


def polls_in(page: Page, seconds: float) -> list[float]:
    """Start times of the requests the page sends to /api/tfgpu/ during the next `seconds`."""
    start = time.monotonic()
    page.page.wait_for_timeout(seconds * 1000)
    return [at for at, _ in page.requests if at >= start]


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


# ----- the restart command while a cell runs ------------------------------------------------------------
class Sleeper:
    """A page on the sleeper notebook: cell 1 sets `x`, cell 2 loads tfgpu_magic with growth on, cells 3
    and 4 sleep two minutes, in Python and in C. `kernel` is a second client on its kernel."""

    def __init__(self, lab: Lab, page: Page) -> None:
        self.lab = lab
        self.page = page
        self.kernel = lab.kernel(SLEEPER)
        self.pid = self.kernel.pid()
        """The kernel's pid (a busy kernel cannot be asked)."""

    def run_setup_cells(self) -> None:
        for index in (0, 1):
            self.page.select_cell(index)
            self.page.run("notebook:run-cell")
        wait_until(lambda: self.kernel.evaluate(
            "globals().get('x') == 41 and __import__('tfgpu_magic').current_policy().growth is True"), 60, "cells run")
        self.page.status_says("growth on")
        self.page.select_cell(0)  # "run up to the selected cell" runs only `x = 41`: the policy must be kept

    def sleep(self, kind: str) -> None:
        """Run the `kind` sleep cell from the page; back once the kernel is busy with it."""
        self.page.select_cell(list(SLEEPER_CELLS).index(SLEEPS[kind]))
        self.page.start("notebook:run-cell")
        kernel_id = self.kernel.kernel_id
        wait_until(lambda: self.lab.server.request("GET", f"api/kernels/{kernel_id}")["execution_state"] == "busy",
                   30, "the kernel busy in the sleeping cell")
        self.page.page.wait_for_timeout(500)  # well into the sleep (C: past the call into libc)
        self.page.select_cell(0)

    def restart(self, command: str) -> tuple[float, float]:
        """Run `command` and accept its restart dialog: seconds from the command to the dialog, and to the
        new kernel answering on the same connection file."""
        old_pid = self.pid
        dialog = self.page.page.locator(".jp-Dialog", has_text="Restart Kernel?")
        started = time.monotonic()
        self.page.start(command)
        dialog.wait_for(state="visible", timeout=30_000)
        shown = time.monotonic() - started
        assert ("GPU policy (growth on)" in dialog.inner_text()) == (command == COMMAND), dialog.inner_text()
        accept_dialog(self.page.page, "Restart Kernel?")
        self.kernel = await_new_kernel(self.kernel, old_pid, timeout=120)
        answered = time.monotonic() - started
        self.pid = self.kernel.pid()
        return shown, answered


@pytest.fixture(scope="module")
def sleeper(lab: Lab, browser: Any) -> Iterator[Sleeper]:  # noqa: F811
    opened = open_page(browser, lab_url(lab.server, SLEEPER))
    try:
        sleeping = Sleeper(lab, opened)
        try:
            sleeping.run_setup_cells()
            yield sleeping
        finally:
            sleeping.kernel.close()
    finally:
        opened.page.close()


RESTART_FIGURES: dict[str, dict[str, tuple[float, float]]] = {}
"""Seconds (to the dialog, to the new kernel) by sleep kind and command, printed for the note."""


@pytest.mark.parametrize("kind", ["python", "c"])
def test_the_restart_never_waits_for_a_sleeping_cell(sleeper: Sleeper, kind: str) -> None:
    """Side by side on the same busy cell: ours (its dialog at once, the policy kept without asking the
    kernel) and JupyterLab's own "Restart Kernel…"; ours is no slower than theirs × 1.5 + 1 s."""
    figures = RESTART_FIGURES.setdefault(kind, {})
    assert sleeper.lab.pending_files() == []
    sleeper.sleep(kind)
    figures["ours"] = sleeper.restart(COMMAND)
    wait_until(lambda: sleeper.kernel.evaluate("globals().get('x')") == 41, 60, "cell 1 run again")
    assert sleeper.kernel.evaluate("__import__('tfgpu_magic').current_policy().growth") is True  # kept, not run
    assert sleeper.lab.pending_files() == []  # taken by the new kernel
    sleeper.kernel.ok("%tfgpu growth on")  # cell 2's state for the next round
    sleeper.sleep(kind)
    figures["jupyterlab"] = sleeper.restart("notebook:restart-kernel")
    sleeper.kernel.ok("x = 41\n%load_ext tfgpu_magic\n%tfgpu growth on")
    (ours_dialog, ours), (_, theirs) = figures["ours"], figures["jupyterlab"]
    print(f"\nrestart while a cell sleeps ({kind}): dialog after {ours_dialog:.2f} s; new kernel after "
          f"{ours:.2f} s (ours) vs {theirs:.2f} s (JupyterLab's notebook:restart-kernel)")
    assert ours_dialog <= 2.0, f"the dialog came after {ours_dialog:.1f} s"
    assert ours <= theirs * 1.5 + 1.0, (ours, theirs)


def test_cancel_keeps_nothing_and_a_plain_restart_later_brings_no_old_policy(sleeper: Sleeper) -> None:
    """Cancel while a cell sleeps: nothing is stored, then or when the cell ends (the old command queued
    its store behind the cell); the policy changes; JupyterLab's plain restart has no tfgpu policy."""
    assert sleeper.lab.pending_files() == []
    sleeper.sleep("python")
    sleeper.page.start(COMMAND)
    dialog = sleeper.page.page.locator(".jp-Dialog", has_text="Restart Kernel?")
    dialog.wait_for(state="visible", timeout=30_000)
    dialog.locator(".jp-Dialog-button.jp-mod-reject").click()
    dialog.wait_for(state="hidden")
    kernel_id = sleeper.kernel.kernel_id
    sleeper.lab.server.request("POST", f"api/kernels/{kernel_id}/interrupt")
    wait_until(lambda: sleeper.lab.server.request("GET", f"api/kernels/{kernel_id}")["execution_state"] == "idle",
               30, "the kernel idle after the interrupt")
    sleeper.kernel.ok("%tfgpu growth off")  # after anything queued behind the cell would have run
    assert sleeper.lab.pending_files() == []
    old_pid = sleeper.pid
    sleeper.page.start("notebook:restart-kernel")
    accept_dialog(sleeper.page.page, "Restart Kernel?")
    sleeper.kernel = await_new_kernel(sleeper.kernel, old_pid, timeout=120)
    sleeper.pid = sleeper.kernel.pid()
    assert sleeper.kernel.evaluate(NO_POLICY_KEPT)
    assert sleeper.lab.pending_files() == []


UUID = "GPU-8932f937-aaaa-bbbb-cccc-000000000000"
WORDED_POLICY = Policy(
    visible=("0", "1", UUID), limits=(("0", 2048), ("1", 40960), ("3", 2048), (ALL_GPUS, 4096)),
    splits=(("2", (1024, 1024)), (UUID, (1024, 3072))), cpu_devices=2, allocator="async", loglevel="error",
    limits_written=(("1", "50%"),))
"""A policy with every field the browser words (not one a machine would accept: data to word)."""


def worded_kernel_reply(kernel_id: str, pid: int) -> dict[str, Any]:
    """`$defs/kernelReply` for `WORDED_POLICY`, TensorFlow initialized by cell 7, two pending changes."""
    return conforms({
        **KERNEL_STAMP,
        "kernel": {"kernel_id": kernel_id, "notebook": SLEEPER, "execution_state": "idle", "idle_seconds": 5.0,
                   "tensorflow": "initialized"},
        "pid": pid, "published": True, "policy": policy_record(WORDED_POLICY),
        "tensorflow": {"state": "initialized", "cuda_started": True,
                       "initialized_by": {"where": "cell", "execution_count": 7, "line": "model.fit(x, y)"},
                       "memory": []},
        "pending": [
            {"setting": "logical", "device": "GPU:0", "now": None, "wanted": [{"memory": GIB * MIB}, {"memory": GIB * MIB}],
             "why": "initialized", "needs_restart": True},
            {"setting": "cpus", "device": "CPU", "now": None, "wanted": [{"memory": None}, {"memory": None}],
             "why": "import", "needs_restart": True},
        ],
        "restart_needed": True, "keep": True, "gpus_from": "policy", "gpus": [],
        "gpu_status": {"error": None, "stale_seconds": None, "host_pids": False}, "error": None,
        "frameworks": None, "history": empty_reply(None, SAMPLE_SECONDS),
    }, "kernelReply")


def test_the_browser_words_a_policy_as_the_magic_does(sleeper: Sleeper) -> None:
    """A reply carrying `WORDED_POLICY` as data (`kernelstate.policy_record`, the record the kernel
    publishes): the status tooltip words it as the magic's status does (`describe_policy`), and words
    TensorFlow's state and each pending change from their enums."""
    body = json.dumps(worded_kernel_reply(sleeper.kernel.kernel_id, sleeper.pid))
    with tfgpu_requests_answered(sleeper.page, answering(body)):
        sleeper.page.status_says("split cpu into 2 logical devices")
        title = sleeper.page.status.get_attribute("title").splitlines()
    assert f"Policy: {', '.join(describe_policy(WORDED_POLICY))}" in title
    assert "TensorFlow: initialized by In [7]: model.fit(x, y)" in title
    assert "  - logical devices of GPU:0: TF default → 1GB + 1GB" in title
    assert "  - logical CPU devices: TF default → 2 logical devices (read when TensorFlow was imported)" in title
    assert sleeper.page.caption().startswith("Store the GPU policy")


def test_a_failed_store_says_so_and_restarts_nothing(sleeper: Sleeper) -> None:
    """The server refuses to keep the policy (409, as for a state file it cannot use), its body the schema's
    `$defs/error`: an error dialog wording its code (the server's English after it), and the kernel is not
    restarted."""
    sleeper.kernel.ok("%load_ext tfgpu_magic\n%tfgpu growth on")
    sleeper.page.status_says("growth on")
    refused = json.dumps(conforms({"code": "keep_failed", "message": "the policy could not be kept: disk full"}, "error"))

    def keep_refused(route: Any) -> None:
        if route.request.method == "POST" and urlsplit(route.request.url).path.endswith("/keep"):
            route.fulfill(status=409, content_type="application/json", body=refused)
        else:
            route.continue_()

    with tfgpu_requests_answered(sleeper.page, keep_refused):
        sleeper.page.start(COMMAND)
        accept_dialog(sleeper.page.page, "Restart Kernel?")
        error = sleeper.page.page.locator(".jp-Dialog", has_text="GPU policy not kept; the kernel was not restarted")
        error.wait_for(state="visible")
        assert "The server could not store the GPU policy for the new kernel." in error.inner_text()
        assert "Server: the policy could not be kept: disk full" in error.inner_text()
        error.locator(".jp-Dialog-button").click()  # its one button, "Close"
    assert sleeper.kernel.pid() == sleeper.pid and sleeper.lab.pending_files() == []


def test_a_state_file_tfgpu_magic_did_not_write_is_said_and_keeps_no_policy(sleeper: Sleeper) -> None:
    """The kernel's published state replaced by a file of another format: the server says state_invalid,
    the sidebar says so with the fix, the command would not keep a policy (its caption says why)."""
    sleeper.kernel.ok("%load_ext tfgpu_magic\n%tfgpu growth on")
    path = sleeper.lab.server.env.runtime_dir / f"tfgpu-state-{sleeper.kernel.kernel_id}.json"
    original = wait_until(lambda: path.is_file() and path.read_bytes(), 30, "the kernel's state file")
    path.write_text(json.dumps({"format": "someone else's"}))
    try:
        sleeper.page.open_sidebar()
        text = sleeper.page.sidebar_says("state file is not one tfgpu_magic wrote")
        assert "Restart the kernel" in text
        wait_until(lambda: "the kernel's state file is not one tfgpu_magic wrote" in sleeper.page.caption(), 30,
                   "the caption saying why no policy is kept")
    finally:
        path.write_bytes(original)
    sleeper.page.sidebar_says("This notebook: .* growth on")
    assert sleeper.page.sidebar.locator(".tfgpu-problem").count() == 0


def test_a_kernel_that_is_not_python_gets_jupyterlabs_own_restart(lab: Lab, sleeper: Sleeper) -> None:
    """Its kernelspec names another language: the command's caption says so, and it runs JupyterLab's
    Restart Kernel and Run up to Selected Cell (its dialog, without our policy words), which restarts it."""
    page = sleeper.page
    page.run("docmanager:open", path=OTHER, factory="Notebook")
    page.page.wait_for_function(NOTEBOOK_READY, arg=OTHER, timeout=UI_TIMEOUT_MS)
    kernel = lab.kernel(OTHER)
    try:
        pid = kernel.pid()
        wait_until(lambda: "(the kernel is not Python)" in page.caption(), 30, "the caption saying why")
        page.start(COMMAND)
        dialog = page.page.locator(".jp-Dialog", has_text="Restart Kernel?")
        dialog.wait_for(state="visible")
        assert "GPU policy" not in dialog.inner_text()
        accept_dialog(page.page, "Restart Kernel?")
        kernel = await_new_kernel(kernel, pid, timeout=120)
    finally:
        kernel.close()
        page.run("docmanager:save")
        page.run("application:close")


# ----- servers without figures ------------------------------------------------------------------------
ZERO_GPU_SERVER_CONFIG = """# Written by tests/test_labextension.py: this server's NVML answers and lists no card.
import sys
sys.path.insert(0, {tests!r})
from fake_nvml import FakeNvml
from tfgpu_magic.gpus import inventory

NVML = inventory.Nvml(module=FakeNvml([]))
inventory.shared_nvml = lambda: NVML
c.ServerApp.jpserver_extensions.update({{"tfgpu_magic.serverext": True}})
"""
REAL_NVML_SERVER_CONFIG = """# Written by tests/test_labextension.py: this server reads the machine's own NVML.
c.ServerApp.jpserver_extensions.update({"tfgpu_magic.serverext": True})
"""
NVML_WORDS = {
    "nvml_missing": ("NVML is not installed for the Jupyter server's Python", "pip install nvidia-ml-py",
                     "NVML not installed"),
    "no_driver": ("No NVIDIA driver on this machine", "docker run --gpus all", "no NVIDIA driver"),
    "nvml_failed": ("NVML did not start", "%tfgpu doctor", "NVML did not start"),
}
"""What the sidebar says for each NVML error code, its fix, and what the status item says."""


@contextlib.contextmanager
def configured_lab(config: str) -> Iterator[JupyterServer]:
    """A JupyterLab with `config` as its server config, and a notebook."""
    with lab_env("tfgpu-labext-nvml-") as env:
        (env.config_dir / "jupyter_server_config.py").write_text(config)
        write_notebook(env.root, NOTEBOOK, ("x = 1",))
        with jupyterlab(env) as server:
            yield server


@contextlib.contextmanager
def sidebar_open(browser: Any, server: JupyterServer, notebook: bool = False) -> Iterator[Page]:  # noqa: F811
    """A page of `server` open on the GPU sidebar (and on the notebook, where `notebook`)."""
    page = open_page(browser, lab_url(server, NOTEBOOK if notebook else None), kernel=notebook)
    try:
        page.open_sidebar()
        yield page
    finally:
        page.page.close()


@pytest.fixture(scope="module")
def no_card_lab() -> Iterator[JupyterServer]:
    """A JupyterLab whose NVML answers and lists no card, for the tests that need no kernel of its own."""
    with configured_lab(ZERO_GPU_SERVER_CONFIG.format(tests=str(Path(__file__).resolve().parent))) as server:
        yield server


def test_no_nvidia_driver_or_no_nvml_is_said_with_the_fix(browser: Any, shots: Path) -> None:  # noqa: F811
    """This machine's own NVML: no driver here (or no nvidia-ml-py where there is one). The status item
    says it in a few words, the fix in its tooltip."""
    with configured_lab(REAL_NVML_SERVER_CONFIG) as server, sidebar_open(browser, server, notebook=True) as page:
        status = conforms(server.request("GET", "api/tfgpu/gpus"), "gpusReply")["gpu_status"]
        if status["error"] is None:
            pytest.skip("this machine's NVML answers: no error state to show")
        what, fix, short = NVML_WORDS[status["error"]["code"]]
        text = page.sidebar_says(re.escape(what))
        assert fix in text and page.sidebar.locator(".tfgpu-gpu-card").count() == 0
        assert page.sidebar.locator(".tfgpu-problem").get_attribute("title") == status["error"]["message"]
        page.sidebar.screenshot(path=str(shots / f"labextension-error-{status['error']['code'].replace('_', '-')}.png"))
        page.status_says(rf"· {short}$")
        assert fix in page.status.get_attribute("title")


def test_nvml_with_no_card_says_so(browser: Any, no_card_lab: JupyterServer, shots: Path) -> None:  # noqa: F811
    with sidebar_open(browser, no_card_lab) as page:
        assert conforms(no_card_lab.request("GET", "api/tfgpu/gpus"), "gpusReply")["gpus"] == []
        page.sidebar_says("NVML lists no GPU on this machine.")
        assert page.sidebar.locator(".tfgpu-gpu-card").count() == 0
        page.sidebar.screenshot(path=str(shots / "labextension-error-no-gpu.png"))


def card(index: int, **fields: Any) -> dict[str, Any]:
    return {"index": index, "name": "NVIDIA A100-SXM4-80GB", "uuid": f"GPU-{index:08x}-0000-0000-0000-000000000000",
            "memory_total": 80 * GIB * MIB, "memory_used": 20 * GIB * MIB, "utilization": 50, "mig": [],
            "granted": True, "processes": [], **fields}


STATES_THIS_MACHINE_CANNOT_MAKE = {
    "nvml_missing": {**GPUS_STAMP, "gpus": [],
                     "gpu_status": {"error": {"code": "nvml_missing", "message": "no pynvml"},
                                    "stale_seconds": None, "host_pids": False}},
    "driver_not_answering": {
        **GPUS_STAMP,
        "gpus": [card(0), card(1, granted=False, processes=[
            {"pid": 31337, "gpu_memory": 3 * GIB * MIB, "memory_source": "tensorflow", "mine": True, "user": "me",
             "kernel": {"kernel_id": "k1", "notebook": "train.ipynb", "execution_state": "busy", "idle_seconds": 0,
                        "tensorflow": "initialized"}}])],
        "gpu_status": {"error": {"code": "driver_not_answering", "message": "an NVML call has waited 9 s"},
                       "stale_seconds": 42.0, "host_pids": True}},
}
"""`$defs/gpusReply`s for states a machine without a GPU cannot make; the test checks them against the
schema and has Playwright answer the page's requests with them."""


def answering(body: str) -> Callable[[Any], None]:
    """A route handler answering `body` as the server's JSON."""
    return lambda route: route.fulfill(status=200, content_type="application/json", body=body)


def test_states_of_a_gpu_machine_are_worded_from_their_codes(
        browser: Any, no_card_lab: JupyterServer, shots: Path) -> None:  # noqa: F811
    """NVML missing; a driver that stopped answering (figures 42 s old), a card outside the server's
    grant, a server in a container of its own with a kernel's row by TensorFlow's figure."""
    with sidebar_open(browser, no_card_lab) as page:
        for code, reply in STATES_THIS_MACHINE_CANNOT_MAKE.items():
            with tfgpu_requests_answered(page, answering(json.dumps(conforms(reply, "gpusReply")))):
                page.page.evaluate("() => { window.jupyterapp.shell.collapseRight(); }")
                page.open_sidebar()  # asks again now
                if code == "nvml_missing":
                    what, fix, _ = NVML_WORDS[code]
                    assert fix in page.sidebar_says(re.escape(what))
                else:
                    text = page.sidebar_says("not answering")
                    assert (stale_age(text) or 0) >= 42 and "%tfgpu doctor" in text
                    assert "docker run --pid=host" in text and "hostPID: true" in text
                    grant = page.sidebar.locator(".tfgpu-not-granted")
                    assert grant.count() == 1 and "not for this server's kernels" in grant.inner_text()
                    assert f"train.ipynb · {bytes_text(3 * GIB * MIB)} (TensorFlow's figure) · busy" in grant.inner_text()
                page.sidebar.screenshot(path=str(shots / f"labextension-error-{code.replace('_', '-')}.png"))


# ----- Notebook 7 -------------------------------------------------------------------------------------
def test_notebook_7_has_the_sidebar_and_the_restart_command(browser: Any) -> None:  # noqa: F811
    """No status bar there; the sidebar (opened as the status item would) and the command from the Kernel
    menu work, the policy kept across the restart (growth on, checked without TensorFlow)."""
    pytest.importorskip("notebook", minversion="7")
    with fake_gpu_env("tfgpu-labext-nb7-") as (env, placement):
        write_notebook(env.root, NOTEBOOK, CELLS[:2])
        expose = "--JupyterNotebookApp.expose_app_in_browser=True"
        with running_server(env, app="notebook", extra_args=(expose,)) as server:
            page = open_page(browser, f"{server.url}notebooks/{NOTEBOOK}?token={server.token}")
            try:
                page.run("notebook:run-all-cells")
                kernel = server.connect(notebook_session(server, NOTEBOOK)["kernel"]["id"])
                wait_until(lambda: kernel.evaluate("globals().get('x')") == 41, 60, "cells run")
                old_pid = kernel.pid()
                place(placement, {old_pid: (1, 2 * GIB)})
                assert page.status.count() == 0
                page.open_sidebar()
                cards = page.sidebar.locator(".tfgpu-gpu-card")
                wait_until(lambda: cards.count() == 4, 30, "four GPU cards")
                wait_until(lambda: "← this notebook" in cards.nth(1).inner_text(), 30, "this notebook on GPU 1")
                assert page.sidebar.locator(".tfgpu-kernel").inner_text().startswith("This notebook: GPU 1 · growth on")
                kernel.ok("x = 0")
                page.select_cell(0)
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


# ----- last: the server extension off, its first minute counted ---------------------------------------------
def test_with_the_server_extension_off_it_asks_at_most_six_times_a_minute(
        extension_off: tuple[JupyterServer, Page]) -> None:
    """`extension_off`'s page, polling at 1 s, open since the module's first test: it sends at most 6
    requests to /api/tfgpu/ in the first minute, counted from its first by the browser's clock (one that got
    no response counts as in the minute). Last in the module, so the minute has passed while the others ran;
    run alone, this test waits it out."""
    _, page = extension_off

    def first_sent() -> float | None:
        page.page.wait_for_timeout(100)  # Playwright's events come while it waits
        return min(filter(None, page.sent_at()), default=None)

    first = wait_until(first_sent, 30, "the page's first request to /api/tfgpu/")
    page.page.wait_for_timeout(max(0.0, first + 60 - time.time()) * 1000)
    sent = [at for at in page.sent_at() if at is None or first <= at <= first + 60]
    print(f"\nserver extension off: {len(sent)} requests to /api/tfgpu/ in the first minute (refresh rate 1 s)")
    assert 1 <= len(sent) <= FAILING_CAP, sent
    assert page.page.evaluate("document.visibilityState") == "visible"
