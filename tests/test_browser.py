"""The panel in a real JupyterLab, driven by headless Chromium through Playwright.

JupyterLab runs on 127.0.0.1 with a token in a throwaway Jupyter environment (tests/servers.py). The
test opens a notebook, shows the panel, clicks growth and the CPU split, checks in the kernel (through
a second client on the same kernel) that TensorFlow has the policy, then goes through the panel's
restart-and-apply flow and checks the new kernel. It also saves screenshots of the panel to docs/.
Needs Debian's `chromium` (`.ci/run` installs it); skipped with the reason where it is missing.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
from servers import JupyterServer, await_new_kernel, isolated_jupyter, running_server, wait_until

pytestmark = pytest.mark.kernel

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parent.parent / "docs"
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


def write_notebook(root: Path) -> None:
    """A notebook that imports TensorFlow (not initialized) and shows the panel."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell("import tensorflow as tf"),
        nbformat.v4.new_code_cell("%load_ext tfgpu_magic\n%tfgpu panel"),
    ]
    nbformat.write(nb, str(root / "panel.ipynb"))


def notebook_kernel_id(server: JupyterServer) -> str:
    """The id of the kernel JupyterLab started for the notebook."""
    sessions = wait_until(lambda: server.request("GET", "api/sessions") or None, 60, "a notebook session")
    return sessions[0]["kernel"]["id"]


@pytest.fixture(scope="module")
def lab():
    with isolated_jupyter("tfgpu-lab-") as env:
        write_notebook(env.root)
        with running_server(env, app="jupyterlab", extra_args=("--LabApp.expose_app_in_browser=True",)) as server:
            yield server


@pytest.fixture(scope="module")
def page(lab: JupyterServer):
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 950})
            page.set_default_timeout(UI_TIMEOUT_MS)
            page.goto(f"{lab.url}lab/tree/panel.ipynb?reset&token={lab.token}")
            page.wait_for_function(KERNEL_READY, timeout=UI_TIMEOUT_MS)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.get_by_text("Restart kernel and apply").wait_for()
            yield page
        finally:
            browser.close()


def panel_output(page):  # noqa: ANN001, ANN201
    return page.locator(".jp-OutputArea-output").filter(has_text="Restart kernel and apply").last


def set_cpu_devices(page, count: int) -> None:  # noqa: ANN001
    field = panel_output(page).locator(".widget-inline-hbox", has_text="CPU devices").locator("input")
    field.fill(str(count))
    field.press("Enter")


def test_clicks_apply_the_policy_in_the_kernel(lab: JupyterServer, page) -> None:  # noqa: ANN001
    """Growth and a CPU split chosen in the panel, then Apply: TensorFlow has them."""
    panel = panel_output(page)
    panel.locator(".widget-dropdown", has_text="Growth").locator("select").select_option("on")
    set_cpu_devices(page, 2)
    panel.locator("button").filter(has_text=re.compile(r"^\s*Apply\s*$")).click()
    kernel = lab.connect(notebook_kernel_id(lab))
    try:
        wait_until(lambda: kernel.evaluate(RECORDED_CPUS) == 2, 30, "the split recorded by TensorFlow")
        assert kernel.evaluate("__import__('tfgpu_magic').current_policy().growth") is True
        assert kernel.evaluate(CPU_COUNT) == 2
    finally:
        kernel.close()
    DOCS.mkdir(exist_ok=True)
    panel.screenshot(path=str(DOCS / "panel.png"))


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
