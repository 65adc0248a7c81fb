"""The labextension's "Save GPU Policy to Notebook Metadata" in real JupyterLab, headless Chromium.

A notebook runs `%tfgpu growth on`; the command puts the kernel's policy, as the server's `directives`
(tfgpu_magic/serverext/gather.py, from what the kernel published), into the notebook model's
`metadata.tfgpu.policy`; after JupyterLab's own save the file on disk holds `["growth on"]`, its other
metadata as it was, and the reader the tfgpu provisioner uses (`notebook_request.read_request`) takes it.
A kernel without tfgpu_magic gets a dialog that says so, and the notebook is left as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import nbformat
import pytest
from servers import JupyterServer, wait_until
from test_browser import browser, notebook_session  # noqa: F401 (browser: the fixture)
from test_labextension import Page, jupyterlab, lab_env, open_page, lab_url
from test_serverext import conforms

from tfgpu_magic.jupyter.notebook_request import SESSION_NAME_ENV, NotebookRequest, read_request

pytestmark = pytest.mark.kernel

COMMAND = "tfgpu:save-policy-to-notebook"
LABEL = "Save GPU Policy to Notebook Metadata"
SAVED = "policy.ipynb"
PLAIN = "plain.ipynb"
OTHER_METADATA = {"colab": {"provenance": []}, "tfgpu": {"note": "kept as it was"}}


def _write(root: Path, name: str, cells: tuple[str, ...]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata.update({"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                        **json.loads(json.dumps(OTHER_METADATA))})
    nb.cells = [nbformat.v4.new_code_cell(code) for code in cells]
    nbformat.write(nb, str(root / name))


def _metadata(root: Path, name: str) -> dict[str, Any]:
    return json.loads((root / name).read_text(encoding="utf-8"))["metadata"]


@pytest.fixture(scope="module")
def lab() -> Iterator[JupyterServer]:
    with lab_env("tfgpu-labext-nbpolicy-") as env:
        _write(env.root, SAVED, ("%load_ext tfgpu_magic\n%tfgpu growth on",))
        _write(env.root, PLAIN, ("x = 1",))
        with jupyterlab(env) as server:
            yield server


def _opened(lab: JupyterServer, browser: Any, name: str) -> Page:  # noqa: F811
    page = open_page(browser, lab_url(lab, name))
    page.run("notebook:run-all-cells")
    return page


def test_the_command_saves_the_kernels_policy_as_lines_into_the_notebooks_metadata(
        lab: JupyterServer, browser: Any) -> None:  # noqa: F811
    page = _opened(lab, browser, SAVED)
    try:
        assert page.page.evaluate("(id) => window.jupyterapp.commands.label(id)", COMMAND) == LABEL
        kernel_id = notebook_session(lab, SAVED)["kernel"]["id"]
        reply = wait_until(lambda: (r := lab.request("GET", f"api/tfgpu/kernels/{kernel_id}"))["directives"] and r,
                           60, "the kernel publishing its policy")
        assert conforms(reply, "kernelReply")["directives"] == ["growth on"]
        assert page.run(COMMAND) is True
        in_model = page.page.evaluate("() => window.jupyterapp.shell.currentWidget.model.getMetadata('tfgpu')")
        assert in_model == {"note": "kept as it was", "policy": ["growth on"]}
        assert _metadata(lab.env.root, SAVED)["tfgpu"] == OTHER_METADATA["tfgpu"]  # not saved by the command
        page.run("docmanager:save")
        saved = _metadata(lab.env.root, SAVED)
        assert saved["tfgpu"] == {"note": "kept as it was", "policy": ["growth on"]}
        assert saved["colab"] == OTHER_METADATA["colab"] and saved["kernelspec"]["name"] == "python3"
        path = str(lab.env.root / SAVED)
        assert read_request({SESSION_NAME_ENV: path}, None) == NotebookRequest(
            ("growth on",), None, None, path, None, False, True)
    finally:
        page.page.close()


def test_a_kernel_without_tfgpu_magic_is_said_and_the_notebook_left_as_it_was(
        lab: JupyterServer, browser: Any) -> None:  # noqa: F811
    page = _opened(lab, browser, PLAIN)
    try:
        page.start(COMMAND)
        dialog = page.page.locator(".jp-Dialog", has_text="GPU policy not saved")
        dialog.wait_for(state="visible")
        assert "tfgpu_magic is not loaded in this kernel" in dialog.inner_text()
        dialog.locator(".jp-Dialog-button").last.click()  # its one button, "Dismiss"
        dialog.wait_for(state="hidden")
        in_model = page.page.evaluate("() => window.jupyterapp.shell.currentWidget.model.getMetadata('tfgpu')")
        assert in_model == OTHER_METADATA["tfgpu"]
    finally:
        page.page.close()
