"""The panel in a real JupyterLab, driven by headless Chromium through Playwright.

JupyterLab runs on 127.0.0.1 with a token in a throwaway Jupyter environment (tests/servers.py). The
test opens a notebook, shows the panel, clicks growth and the CPU split, checks in the kernel (through
a second client on the same kernel) that TensorFlow has the policy, then goes through the panel's
restart-and-apply flow and checks the new kernel. The same click-and-apply flow runs in Notebook 7.
A second notebook runs on a test-only kernelspec (tests/fake_gpu_kernel.py) whose NVML is the fake
four cards, to check that the GPU rows line up. It saves screenshots of the panel to docs/.
Needs Debian's `chromium` (`.ci/run` installs it); skipped with the reason where it is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from servers import JupyterServer, await_new_kernel, isolated_jupyter, running_server, wait_until

from tfgpu_magic.views.panel import COLUMNS

pytestmark = pytest.mark.kernel

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TESTS = Path(__file__).resolve().parent
DOCS = TESTS.parent / "docs"
FAKE_GPUS_KERNEL = "fake-gpus"
UI_TIMEOUT_MS = 90_000
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

playwright = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)", allow_module_level=True)


def write_notebook(root: Path, name: str = "panel.ipynb", kernel: str = "python3",
                   first: str = "import tensorflow as tf", show: str = "%tfgpu panel") -> None:
    """A notebook on kernelspec `kernel` that runs `first` (by default: imports TensorFlow, not
    initialized), loads the extension and shows the panel with `show`."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(first), nbformat.v4.new_code_cell(f"%load_ext tfgpu_magic\n{show}")]
    nbformat.write(nb, str(root / name))


def write_fake_gpus_kernelspec(kernels_dir: Path) -> None:
    """A kernelspec, only in the test's Jupyter data dir, whose kernel sees the fake four GPUs."""
    spec = {"argv": [sys.executable, str(TESTS / "fake_gpu_kernel.py"), "-f", "{connection_file}"],
            "display_name": "tests: fake GPUs", "language": "python"}
    (kernels_dir / FAKE_GPUS_KERNEL).mkdir(parents=True)
    (kernels_dir / FAKE_GPUS_KERNEL / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")


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
                       show="tfgpu_magic.panel()")
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


def open_panel(browser, url: str):  # noqa: ANN001, ANN201
    """A page on `url` whose notebook has run all cells and shows the panel."""
    page = browser.new_page(viewport={"width": 1500, "height": 950})
    page.set_default_timeout(UI_TIMEOUT_MS)
    page.goto(url)
    page.wait_for_function(KERNEL_READY, timeout=UI_TIMEOUT_MS)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.get_by_role("button", name=re.compile("Restart kernel and apply")).wait_for()
    return page


@pytest.fixture(scope="module")
def page(lab: JupyterServer, browser):  # noqa: ANN001
    page = open_panel(browser, f"{lab.url}lab/tree/panel.ipynb?reset&token={lab.token}")
    yield page
    page.close()


def panel_output(page):  # noqa: ANN001, ANN201
    return page.locator(".jp-OutputArea-output").filter(has_text="Restart kernel and apply").last


def set_cpu_devices(page, count: int) -> None:  # noqa: ANN001
    field = panel_output(page).locator(".widget-inline-hbox", has_text="CPU devices").locator("input")
    field.fill(str(count))
    field.press("Enter")


def click_growth_and_cpus_then_apply(server: JupyterServer, page) -> None:  # noqa: ANN001
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


def test_clicks_apply_the_policy_in_the_kernel(lab: JupyterServer, page) -> None:  # noqa: ANN001
    """Growth and a CPU split chosen in the panel, then Apply: TensorFlow has them."""
    click_growth_and_cpus_then_apply(lab, page)
    DOCS.mkdir(exist_ok=True)
    panel_output(page).screenshot(path=str(DOCS / "panel.png"))


def test_gpu_rows_line_up(lab: JupyterServer, browser) -> None:  # noqa: ANN001
    """On the fake-GPU kernel (the fake NVML decides the four cards, the busy one and the MIG one)
    the rows form one table: each column starts at the same x in every row, no cell wraps onto a
    second line, GPU 0 marks this kernel's share; and `tfgpu_magic.panel()` as the cell's last line
    leaves the panel as its only output."""
    page = open_panel(browser, f"{lab.url}lab/tree/gpus.ipynb?reset&token={lab.token}")
    try:
        panel = panel_output(page)
        panel.get_by_text("you: 1.0 GiB").wait_for()
        rows = panel.locator(".widget-gridbox").evaluate("""(grid, columns) => {
          const cells = Array.from(grid.children).map(c => c.getBoundingClientRect());
          const rows = [];
          for (let i = 0; i < cells.length; i += columns) rows.push(cells.slice(i, i + columns));
          return rows.map(r => r.map(c => [Math.round(c.left), Math.round(c.top), Math.round(c.height)]));
        }""", len(COLUMNS))
        assert len(rows) == 5  # the header and four cards
        assert all([cell[0] for cell in row] == [cell[0] for cell in rows[0]] for row in rows)
        assert all(cell[2] <= 32 for row in rows for cell in row), rows  # one line (inputs are ~28px)
        text = panel.inner_text()
        assert "20.0 / 80 GiB" in text and "50% busy" in text and "MIG ×2" in text
        outputs = page.locator(".jp-Cell").last.locator(".jp-OutputArea-output")
        assert outputs.count() == 1 and "Panel at 0x" not in outputs.inner_text()  # panel() adds no repr
        panel.screenshot(path=str(DOCS / "panel-gpus.png"))
    finally:
        page.close()
        lab.request("DELETE", f"api/sessions/{notebook_session(lab, 'gpus.ipynb')['id']}")


def test_notebook_7_panel_applies(browser) -> None:  # noqa: ANN001
    """The same clicks in Notebook 7 (the `notebook` package, /notebooks/<path>) reach TensorFlow."""
    pytest.importorskip("notebook", minversion="7")
    with isolated_jupyter("tfgpu-nb7-") as env:
        write_notebook(env.root)
        expose = "--JupyterNotebookApp.expose_app_in_browser=True"
        with running_server(env, app="notebook", extra_args=(expose,)) as server:
            page = open_panel(browser, f"{server.url}notebooks/panel.ipynb?token={server.token}")
            try:
                click_growth_and_cpus_then_apply(server, page)
                panel_output(page).screenshot(path=str(DOCS / "panel-notebook7.png"))
            finally:
                page.close()


def test_locked_panel_restart_button_applies_in_a_fresh_kernel(lab: JupyterServer, page) -> None:  # noqa: ANN001
    """After initialization a new split is pending; Restart + confirm gives a new kernel with it."""
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
    panel.screenshot(path=str(DOCS / "panel-dark-locked.png"))
    panel.get_by_role("button", name="Restart kernel and apply").click()
    panel.get_by_role("button", name="Yes, restart (variables are lost)").click()
    kernel = await_new_kernel(kernel, old_pid, timeout=90)
    try:
        wait_until(lambda: kernel.evaluate("'tfgpu_magic' in get_ipython().extension_manager.loaded"),
                   60, "the extension re-loaded in the new kernel")
        assert kernel.pid() != old_pid
        assert kernel.evaluate(CPU_COUNT) == 3
    finally:
        kernel.close()
