"""The panel in a real JupyterLab, driven by headless Chromium through Playwright.

JupyterLab runs on 127.0.0.1 with a token in a throwaway Jupyter environment (tests/servers.py). The
test opens a notebook, shows the panel, clicks growth and the CPU split, checks in the kernel (through
a second client on the same kernel) that TensorFlow has the policy, then goes through the panel's
restart-and-apply flow and checks the new kernel. The same click-and-apply flow runs in Notebook 7.
A second notebook runs on a test-only kernelspec (tests/fake_gpu_kernel.py) whose NVML is the fake
four cards, to check that the GPU rows line up.

Every page is 1280×800, JupyterLab's with the file browser open (about 830 px left for an output): the
panel must fit there, nothing wider than the output, no button label or table cell cut to "…".
Screenshots of the panel go to docs/ only under `make screenshots` (TFGPU_SCREENSHOTS=docs), else to a
temporary directory, so a test run never rewrites the tracked PNGs.
Needs Debian's `chromium` (`.ci/run` installs it); skipped with the reason where it is missing.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Mapping

import nbformat
import pytest
from fake_gpu_kernel import KERNEL_NAME as FAKE_GPUS_KERNEL
from fake_gpu_kernel import write_kernelspec as write_fake_gpus_kernelspec
from servers import JupyterServer, await_new_kernel, isolated_jupyter, running_server, wait_until

from tfgpu_magic.views.panel import COLUMNS

pytestmark = pytest.mark.kernel

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TESTS = Path(__file__).resolve().parent
DOCS = TESTS.parent / "docs"
SCREENSHOTS = "TFGPU_SCREENSHOTS"
"""`docs` (what `make screenshots` sets): the screenshots refresh docs/*.png; unset: a temporary directory."""
VIEWPORT = {"width": 1280, "height": 800}
NARROW = {"width": 1024, "height": 800}
UI_TIMEOUT_MS = 90_000
RESTART_CELL = "%tfgpu growth on\n%tfgpu restart"
"""`%tfgpu restart` without --yes: its one "Restart kernel and apply" button, not pressed here."""
KERNEL_READY = """() => {
  const widget = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const kernel = widget && widget.sessionContext && widget.sessionContext.session
    && widget.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle';
}"""
CPU_COUNT = "len(__import__('tensorflow').config.list_logical_devices('CPU'))"
RECORDED_CPUS = (
    "len(__import__('tensorflow').config.get_logical_device_configuration("
    "__import__('tensorflow').config.list_physical_devices('CPU')[0]) or [1])"
)

LEFT_SIDEBAR = """() => {
  window.jupyterapp.shell.activateById('filebrowser');
  const stack = document.querySelector('#jp-left-stack');
  return stack ? Math.round(stack.getBoundingClientRect().width) : 0;
}"""
"""Opens JupyterLab's file browser in the left sidebar; its width in px."""
FIT = """(output, cellsWhole) => {
  const problems = [];
  const right = output.getBoundingClientRect().right;
  if (output.scrollWidth > output.clientWidth) problems.push(`output: ${output.scrollWidth} px in ${output.clientWidth}`);
  for (const el of output.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    if (box.width === 0) continue;  // not shown
    const text = (el.innerText || el.placeholder || el.tagName).trim().slice(0, 40);
    if (box.right > right + 0.5) problems.push(`${text}: ends at ${Math.round(box.right)} px, the output at ${Math.round(right)}`);
    const overflow = getComputedStyle(el).overflowX;
    const cut = el.scrollWidth > el.clientWidth && overflow !== 'visible';
    if (cut && (overflow === 'auto' || overflow === 'scroll')) problems.push(`${text}: scrolls sideways, ${el.scrollWidth} px in ${el.clientWidth}`);
    const isCell = el.matches('.widget-gridbox div[style*="text-overflow"]');
    if (cut && (el.tagName === 'BUTTON' || el.matches('.widget-label, .widget-label-basic') || (isCell && cellsWhole)))
      problems.push(`${text}: cut to ${el.clientWidth} of ${el.scrollWidth} px`);
  }
  return problems;
}"""
"""What does not fit in the panel's output area: anything past its right edge, anything scrolling sideways,
button labels and widget labels cut to "…", and (with `cellsWhole`) GPU table cells cut."""

playwright = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)", allow_module_level=True)


def write_notebook(root: Path, name: str = "panel.ipynb", kernel: str = "python3",
                   first: str = "import tensorflow as tf", show: str = "%tfgpu panel", then: str = "") -> None:
    """A notebook on kernelspec `kernel` that runs `first` (by default: imports TensorFlow, not
    initialized), loads the extension and shows the panel with `show`, then runs `then` if given."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(code) for code in (first, f"%load_ext tfgpu_magic\n{show}", then) if code]
    nbformat.write(nb, str(root / name))


def screenshot_dir(environ: Mapping[str, str], scratch: Path) -> Path:
    """docs/ when `TFGPU_SCREENSHOTS=docs`, else `scratch`; any other value is a mistake said in one line."""
    wanted = environ.get(SCREENSHOTS, "")
    if wanted not in ("", "docs"):
        raise pytest.UsageError(f"{SCREENSHOTS}={wanted!r}: set it to 'docs' to refresh docs/*.png, or leave it unset")
    return DOCS if wanted == "docs" else scratch


def test_screenshots_go_to_docs_only_when_asked(tmp_path: Path) -> None:
    assert screenshot_dir({}, tmp_path) == tmp_path and screenshot_dir({SCREENSHOTS: ""}, tmp_path) == tmp_path
    assert screenshot_dir({SCREENSHOTS: "docs"}, tmp_path) == DOCS
    with pytest.raises(pytest.UsageError, match="TFGPU_SCREENSHOTS='1': set it to 'docs'"):
        screenshot_dir({SCREENSHOTS: "1"}, tmp_path)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this run's screenshots go (`screenshot_dir`)."""
    return screenshot_dir(os.environ, tmp_path_factory.mktemp("screenshots"))


def save_screenshot(locator, directory: Path, name: str) -> None:
    """A PNG of `locator` (the panel) as `directory / name`: it rendered, no wider than the page."""
    png = locator.screenshot(path=str(directory / name))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and 0 < int.from_bytes(png[16:20], "big") <= VIEWPORT["width"]


def assert_fits(page, cells_whole: bool = True, output=None) -> None:
    """The panel (or another `output`) fits the page as it is now (`FIT` says what would not)."""
    assert (output or panel_output(page)).evaluate(FIT, cells_whole) == []


def notebook_session(server: JupyterServer, path: str = "panel.ipynb") -> dict:
    """The session (and kernel) the front end started for notebook `path`."""
    def session() -> dict | None:
        return next((s for s in server.request("GET", "api/sessions") or [] if s["path"] == path), None)

    return wait_until(session, 60, f"a session for {path}")


def notebook_kernel_id(server: JupyterServer, path: str = "panel.ipynb") -> str:
    """The id of the kernel the front end started for notebook `path`."""
    return notebook_session(server, path)["kernel"]["id"]


@pytest.fixture(scope="module")
def lab():
    with isolated_jupyter("tfgpu-lab-") as env:
        write_notebook(env.root)
        write_notebook(env.root, "gpus.ipynb", FAKE_GPUS_KERNEL, first="import tfgpu_magic",
                       show="tfgpu_magic.panel()", then=RESTART_CELL)
        write_fake_gpus_kernelspec(env.kernels_dir)
        with running_server(env, app="jupyterlab", extra_args=("--LabApp.expose_app_in_browser=True",)) as server:
            yield server


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, headless=True,
                                          args=["--no-sandbox", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


def open_panel(browser, url: str, lab: bool = True):  # noqa: ANN201
    """A 1280×800 page on `url` whose notebook has run all cells and shows the panel; in JupyterLab
    (`lab`) with the file browser open in the left sidebar."""
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(UI_TIMEOUT_MS)
    page.goto(url)
    page.wait_for_function(KERNEL_READY, timeout=UI_TIMEOUT_MS)
    if lab:
        assert page.evaluate(LEFT_SIDEBAR) >= 200
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    panel_output(page).get_by_role("button", name="Restart kernel and apply").wait_for()
    return page


@pytest.fixture(scope="module")
def page(lab: JupyterServer, browser):
    page = open_panel(browser, f"{lab.url}lab/tree/panel.ipynb?reset&token={lab.token}")
    yield page
    page.close()


def panel_output(page):  # noqa: ANN201
    """The output area showing the (last) panel: the one with the "live memory" box."""
    return page.locator(".jp-OutputArea-output").filter(has_text="live memory").last


def set_cpu_devices(page, count: int) -> None:
    field = panel_output(page).locator(".widget-inline-hbox", has_text="CPU devices").locator("input")
    field.fill(str(count))
    field.press("Enter")


def click_growth_and_cpus_then_apply(server: JupyterServer, page) -> None:
    """Growth on and two CPU devices in the panel, then Apply: TensorFlow in the kernel has them."""
    panel = panel_output(page)
    panel.locator(".widget-dropdown", has_text="Growth").locator("select").select_option("on")
    set_cpu_devices(page, 2)
    panel.locator("button").filter(has_text=re.compile(r"^\s*Apply\s*$")).click()
    kernel = server.connect(notebook_kernel_id(server))
    try:
        wait_until(lambda: kernel.evaluate(RECORDED_CPUS) == 2, 30, "the split recorded by TensorFlow")
        assert kernel.evaluate("__import__('tfgpu_magic').current_policy().growth") is True
        assert kernel.evaluate(CPU_COUNT) == 2
    finally:
        kernel.close()


def test_clicks_apply_the_policy_in_the_kernel(lab: JupyterServer, page, shots: Path) -> None:
    """Growth and a CPU split chosen in the panel, then Apply: TensorFlow has them; the panel with
    Apply's answer fits at 1280×800 beside the file browser."""
    click_growth_and_cpus_then_apply(lab, page)
    assert_fits(page)
    save_screenshot(panel_output(page), shots, "panel.png")


def test_gpu_rows_line_up(lab: JupyterServer, browser, shots: Path) -> None:
    """On the fake-GPU kernel (the fake NVML decides the four cards, the busy one and the MIG one)
    the rows form one table: each column starts at the same x in every row, no cell wraps onto a
    second line, GPU 0 marks this kernel's share; at 1280×800 beside the file browser every cell is
    whole, and at 1024 px nothing sticks out either (cells end in "…", buttons wrap whole);
    `tfgpu_magic.panel()` as the cell's last line leaves the panel as its only output; and the button
    of `%tfgpu restart` in the next cell shows its whole label."""
    page = open_panel(browser, f"{lab.url}lab/tree/gpus.ipynb?reset&token={lab.token}")
    try:
        panel = panel_output(page)
        panel.get_by_text("you: 1.0 GiB").wait_for()
        rows = panel.locator(".widget-gridbox").evaluate("""(grid, columns) => {
          const cells = Array.from(grid.children).map(c => [c.getBoundingClientRect(), c.innerText.trim()]);
          const rows = [];
          for (let i = 0; i < cells.length; i += columns) rows.push(cells.slice(i, i + columns));
          return rows.map(r => r.map(([c, text]) => [Math.round(c.left), Math.round(c.top), Math.round(c.height), text]));
        }""", len(COLUMNS))
        assert len(rows) == 5  # the header and four cards
        assert all([cell[0] for cell in row] == [cell[0] for cell in rows[0]] for row in rows)
        assert all(cell[2] <= 32 for row in rows for cell in row), rows  # one line (inputs are ~28px)
        assert [cell[3] for cell in rows[0]] == [title for title, _ in COLUMNS]
        assert [cell[3] for cell in rows[1]] == ["GPU 0", "A100-SXM4-80GB", "20.0 / 80 GiB", "50%",
                                                 "you: 1.0 GiB · 1 other: 19.0 GiB", "", ""]
        assert [cell[3] for cell in rows[4]][:4] == ["GPU 3", "A100-SXM4-40GB · MIG ×2", "0.0 / 40 GiB", "–"]
        outputs = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea-output")
        assert outputs.count() == 1 and "Panel at 0x" not in outputs.inner_text()  # panel() adds no repr
        restart = page.locator(".jp-Cell").last.locator(".jp-OutputArea-output").filter(
            has=page.get_by_role("button", name="Restart kernel and apply"))
        assert_fits(page)
        assert_fits(page, output=restart)
        save_screenshot(panel, shots, "panel-gpus.png")
        page.set_viewport_size(NARROW)
        assert_fits(page, cells_whole=False)
    finally:
        page.close()
        lab.request("DELETE", f"api/sessions/{notebook_session(lab, 'gpus.ipynb')['id']}")


def test_notebook_7_panel_applies(browser, shots: Path) -> None:
    """The same clicks in Notebook 7 (the `notebook` package, /notebooks/<path>) reach TensorFlow."""
    pytest.importorskip("notebook", minversion="7")
    with isolated_jupyter("tfgpu-nb7-") as env:
        write_notebook(env.root)
        expose = "--JupyterNotebookApp.expose_app_in_browser=True"
        with running_server(env, app="notebook", extra_args=(expose,)) as server:
            page = open_panel(browser, f"{server.url}notebooks/panel.ipynb?token={server.token}", lab=False)
            try:
                click_growth_and_cpus_then_apply(server, page)
                assert_fits(page)
                save_screenshot(panel_output(page), shots, "panel-notebook7.png")
            finally:
                page.close()


def test_locked_panel_restart_button_applies_in_a_fresh_kernel(lab: JupyterServer, page, shots: Path) -> None:
    """After initialization a new split is pending; Restart + confirm gives a new kernel with it. The
    locked panel, and its confirmation buttons, fit at 1280×800 beside the file browser."""
    kernel_id = notebook_kernel_id(lab)
    kernel = lab.connect(kernel_id)
    old_pid = kernel.pid()
    panel = panel_output(page)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")  # refresh the header
    locked = page.get_by_text("device settings are locked").last
    locked.wait_for()
    # The header says where TensorFlow was initialized: here by the test's own silent request, so
    # "outside a cell ..., before In [N]".
    assert "initialized outside a cell" in locked.inner_text() and "before In [" in locked.inner_text()
    set_cpu_devices(page, 3)
    panel = panel_output(page)
    panel.get_by_text("Pending, needs a restart").wait_for()
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_timeout(1500)
    assert_fits(page)
    save_screenshot(panel, shots, "panel-dark-locked.png")
    panel.get_by_role("button", name="Restart kernel and apply").click()
    confirm = panel.get_by_role("button", name="Yes, restart (variables are lost)")
    confirm.wait_for()
    assert_fits(page)
    confirm.click()
    kernel = await_new_kernel(kernel, old_pid, timeout=90)
    try:
        wait_until(lambda: kernel.evaluate("'tfgpu_magic' in get_ipython().extension_manager.loaded"),
                   60, "the extension re-loaded in the new kernel")
        assert kernel.pid() != old_pid
        assert kernel.evaluate(CPU_COUNT) == 3
    finally:
        kernel.close()
