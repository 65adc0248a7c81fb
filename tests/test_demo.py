"""`make demo`: the exact command line it runs serves JupyterLab, as root too, on the quickstart notebook of
the demo's own copy of notebooks/ (git-ignored, made once, never overwritten), with JupyterLab's autosave
on; a notebook made and saved there is there on the next load, and the tracked notebooks stay as they are.

The commands are taken from the real `make -n demo` (the venv and the labextension taken as set up); make
makes the copy in a temporary folder (`DEMO_DIR=...`), and the served command runs on 127.0.0.1 in isolated
Jupyter dirs; everything started is stopped by PID.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from servers import JupyterServer, free_port, isolated_jupyter, wait_until

REPO = Path(__file__).resolve().parent.parent
LAB_TIMEOUT = 25.0
"""Seconds JupyterLab gets to answer (the whole demo test stays under 30 s)."""
DOCMANAGER = "@jupyterlab/docmanager-extension:plugin"
MADE = (".venv/.installed-stamp", "tfgpu_magic/labextension/package.json")
"""The venv and the built JupyterLab extension, prerequisites of `make demo` (taken as made here)."""
NOTEBOOK = "quickstart.ipynb"
"""The notebook the demo opens, in its copy of notebooks/."""
TRACKED = sorted((REPO / "notebooks").glob("*.ipynb"))
"""What the demo copies."""


def make(*args: str, run_as: tuple[str, ...] = ()) -> list[str]:
    """The lines make printed for `make ARGS`, the venv and the labextension taken as made, this Python's bin dir
    as the venv's."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    taken = [option for made in MADE for option in ("-o", made)]
    done = subprocess.run(
        [*run_as, "make", "--no-print-directory", *taken, f"BIN={os.path.dirname(sys.executable)}", *args],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return [line for line in done.stdout.splitlines() if line.strip()]


def demo_command(demo_dir: Path | None, *run_as: str) -> list[str]:
    """The command `make -n demo` serves the demo with (its last line), serving `demo_dir` (None: the Makefile's)."""
    *_, serving = make("-n", "demo", *([f"DEMO_DIR={demo_dir}"] if demo_dir else []), run_as=run_as)
    argv = shlex.split(serving)
    assert argv[:2] == [os.path.join(os.path.dirname(sys.executable), "jupyter"), "lab"], serving
    return argv


def option(argv: list[str], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"--{name}=")]
    return value


def test_make_demo_allows_root_only_as_root(tmp_path: Path) -> None:
    """`--allow-root` is on the demo's command line exactly when make runs as root (uid 0)."""
    assert ("--allow-root" in demo_command(tmp_path)) == (os.geteuid() == 0)
    if os.geteuid() == 0 and shutil.which("setpriv"):
        nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
        assert "--allow-root" not in demo_command(tmp_path, *nobody)


def test_the_demo_serves_a_git_ignored_copy_made_once_and_never_overwritten(tmp_path: Path) -> None:
    """The Makefile's demo folder is one git ignores; make copies every notebook of notebooks/ there once,
    and a notebook changed there stays changed (a missing one is copied again, the others kept)."""
    served = option(demo_command(None), "ServerApp.root_dir")
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: git cannot say what it ignores")
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{served}/{NOTEBOOK}"], cwd=REPO, timeout=30)
    assert ignored.returncode == 0, f"git does not ignore {served}/: the demo's edits would show in git status"
    demo = tmp_path / "demo"
    target = f"DEMO_DIR={demo}", f"{demo}/{NOTEBOOK}"
    make(*target)
    assert sorted(path.name for path in demo.iterdir()) == [path.name for path in TRACKED]
    assert all((demo / path.name).read_bytes() == path.read_bytes() for path in TRACKED)
    edited = [path for path in TRACKED if path.name != NOTEBOOK]
    for path in edited:
        (demo / path.name).write_text("edited in the demo")
    make(*target)
    assert all((demo / path.name).read_text() == "edited in the demo" for path in edited)
    (demo / NOTEBOOK).unlink()
    make(*target)
    assert (demo / NOTEBOOK).read_bytes() == (REPO / "notebooks" / NOTEBOOK).read_bytes()
    assert all((demo / path.name).read_text() == "edited in the demo" for path in edited)


def test_make_demo_serves_its_copy_with_autosave_on_and_keeps_a_new_notebook(tmp_path: Path) -> None:
    """The exact command of `make demo` (as whoever runs the tests: root in CI and Docker) starts a
    JupyterLab whose printed URL opens the quickstart notebook (on a remote machine that URL is all a user
    gets) of the demo's copy, with JupyterLab's autosave on; a notebook made and saved there comes back with
    its cells (what a reload asks for), in the copy, and the tracked notebooks are as they were."""
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install -e '.[test]')")
    before = {path: path.read_bytes() for path in TRACKED}
    demo = tmp_path / "demo"
    make(f"DEMO_DIR={demo}", f"{demo}/{NOTEBOOK}")
    token = secrets.token_hex(16)
    port = free_port()
    argv = demo_command(demo) + [
        "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
    ]  # fmt: skip
    with isolated_jupyter("tfgpu-demo-") as env:
        log = env.root / "lab.log"
        with open(log, "wb") as out:
            lab = subprocess.Popen(
                argv, cwd=REPO, env=env.environ, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        server = JupyterServer(env, lab, f"http://127.0.0.1:{port}/", token, log)
        try:

            def state() -> str:
                if lab.poll() is not None:
                    return f"exited with {lab.returncode}"
                return "answering" if "version" in server.request("GET", "api", timeout=5) else ""

            outcome = wait_until(state, LAB_TIMEOUT, f"JupyterLab on port {port}", interval=0.2)
            text = log.read_text(errors="replace")
            assert outcome == "answering", f"make demo's JupyterLab {outcome}:\n{text}"
            urls = re.findall(r"http://127\.0\.0\.1:\d+(/\S*)", text)
            assert urls and all(url.startswith(f"/lab/tree/{NOTEBOOK}?token=") for url in urls), text
            assert server.request("GET", f"api/contents/{NOTEBOOK}?content=0")["type"] == "notebook"
            settings = server.request("GET", f"lab/api/settings/{DOCMANAGER}")
            autosave = settings["settings"].get("autosave", settings["schema"]["properties"]["autosave"]["default"])
            assert autosave is True, settings["settings"]  # an overrides.json would change the schema's default

            made = server.request("POST", "api/contents", {"type": "notebook"})["path"]
            cell = {"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [], "execution_count": None}
            notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
            server.request("PUT", f"api/contents/{made}", {"type": "notebook", "format": "json", "content": notebook})
            again = server.request("GET", f"api/contents/{made}")
            assert [c["source"] for c in again["content"]["cells"]] == ["x = 1"], again
        finally:
            server.stop()
    assert (demo / made).is_file() and not (REPO / "notebooks" / made).exists()
    assert {path: path.read_bytes() for path in TRACKED} == before
