"""`make demo`: the exact command line it runs serves JupyterLab on the quickstart notebook, as root too,
and leaves the tracked notebook as it is.

The command is taken from the real `make -n demo` (the venv taken as set up) and run on 127.0.0.1 in
isolated Jupyter dirs; everything started is stopped by PID.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from servers import free_port, isolated_jupyter, stop_pids, wait_until

REPO = Path(__file__).resolve().parent.parent
LAB_TIMEOUT = 25.0
"""Seconds JupyterLab gets to answer (the whole demo test stays under 30 s)."""
DOCMANAGER = "@jupyterlab/docmanager-extension:plugin"
LABEXTENSION_BUILT = "tfgpu_magic/labextension/package.json"
"""The built JupyterLab extension, a prerequisite of `make demo` (taken as built here)."""
NOTEBOOK = "quickstart.ipynb"
"""Served from notebooks/, the demo's root."""


def demo_command(*run_as: str) -> list[str]:
    """The command `make demo` runs (`make -n`, the venv taken as set up), for this Python's bin dir."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    stamp = ".venv/.installed-stamp"
    bindir = os.path.dirname(sys.executable)
    done = subprocess.run(
        [*run_as, "make", "--no-print-directory", "-n", "-o", stamp, "-o", LABEXTENSION_BUILT, "demo", f"BIN={bindir}"],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, done.stdout
    return shlex.split(lines[0])


def test_make_demo_allows_root_only_as_root() -> None:
    """`--allow-root` is on the demo's command line exactly when make runs as root (uid 0)."""
    assert ("--allow-root" in demo_command()) == (os.geteuid() == 0)
    if os.geteuid() == 0 and shutil.which("setpriv"):
        nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
        assert "--allow-root" not in demo_command(*nobody)


def test_make_demo_serves_the_quickstart_with_autosave_off() -> None:
    """The exact command of `make demo` (as whoever runs the tests: root in CI and Docker) starts a
    JupyterLab whose printed URL opens notebooks/quickstart.ipynb (on a remote machine that URL is all a
    user gets), that notebook exists there, and JupyterLab's autosave is off, so running the demo does not
    rewrite the tracked notebook."""
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install -e '.[test]')")
    token = secrets.token_hex(16)
    port = free_port()
    argv = demo_command() + [
        "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
    ]  # fmt: skip
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(path: str) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/{path}", headers={"Authorization": f"token {token}"})
        with no_proxy.open(request, timeout=5) as reply:
            return json.loads(reply.read())

    with isolated_jupyter("tfgpu-demo-") as env:
        log = env.root / "lab.log"
        with open(log, "wb") as out:
            lab = subprocess.Popen(
                argv, cwd=REPO, env=env.environ, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:

            def state() -> str:
                if lab.poll() is not None:
                    return f"exited with {lab.returncode}"
                return "answering" if "version" in get("api") else ""

            outcome = wait_until(state, LAB_TIMEOUT, f"JupyterLab on port {port}", interval=0.2)
            text = log.read_text(errors="replace")
            assert outcome == "answering", f"make demo's JupyterLab {outcome}:\n{text}"
            urls = re.findall(r"http://127\.0\.0\.1:\d+(/\S*)", text)
            assert urls and all(url.startswith(f"/lab/tree/{NOTEBOOK}?token=") for url in urls), text
            assert get(f"api/contents/{NOTEBOOK}?content=0")["type"] == "notebook"
            settings = get(f"lab/api/settings/{DOCMANAGER}")  # overrides.json changes the schema's default
            autosave = settings["settings"].get("autosave", settings["schema"]["properties"]["autosave"]["default"])
            assert autosave is False, settings["settings"]
        finally:
            stop_pids([lab.pid])
            lab.wait(timeout=10)
