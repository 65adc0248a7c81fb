"""A browser and a server extension of different versions of the contract (the schema's version,
tfgpu_magic/jupyter/tfgpu-state.schema.json `$defs/version`) say which one is older, in one line in the sidebar, in
words.ts's words, instead of misreading each other's replies.

One JupyterLab without cards (test_labextension.py's `no_card_lab`) and one page on its sidebar: the page
sends its version with every request (`x-version-header`) and the real server, of the same version, answers.
Then Playwright answers the page's requests as servers of other versions would: version 3 (no version
check of its own) with a reply as it wrote them, its version ending its `format`, no `version`; an older
server of the `version` field; a newer one with the 409 `version_mismatch` body the handlers send
(tests/test_serverext.py checks that the real handlers send it).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_browser import browser  # noqa: F401 (the fixture)
from test_labextension import no_card_lab, sidebar_open, tfgpu_requests_answered  # noqa: F401 (fixtures)
from test_serverext import conforms

from tfgpu_magic.jupyter import kernelstate
from tfgpu_magic.serverext.gather import GPUS_STAMP

pytestmark = pytest.mark.kernel

VERSION = kernelstate.schema_version()
HEADER = kernelstate.contract()["x-version-header"]
SERVER_OLDER = "The tfgpu_magic server extension is older than this page's extension"
BROWSER_OLDER = "This page's tfgpu_magic extension is older than the server extension"


NO_CARDS = {"gpus": [], "gpu_status": {"error": None, "stale_seconds": None, "host_pids": False}}


def version_3_gpus_reply(route: Any) -> None:
    """What a server of version 3 answers: its version at the end of its `format`, no `version`."""
    body = {"format": f"{GPUS_STAMP['format']}/3", **NO_CARDS}
    route.fulfill(status=200, content_type="application/json", body=json.dumps(body))


def older_gpus_reply(route: Any) -> None:
    """What a server of the previous version answers, where that one had a `version` (no check of its own)."""
    body = {**GPUS_STAMP, "version": VERSION - 1, **NO_CARDS}
    route.fulfill(status=200, content_type="application/json", body=json.dumps(body))


def newer_server_refusal(route: Any) -> None:
    """What a server of the next version answers a page of this one (`handlers.TFGPUHandler.same_version`)."""
    sent = route.request.headers.get(HEADER.lower())
    body = conforms({"code": "version_mismatch", "message": f"the client speaks version {sent!r}, this server {VERSION + 1}",
                     "server_version": VERSION + 1, "client_version": int(sent)}, "error")
    route.fulfill(status=409, content_type="application/json", body=json.dumps(body))


def test_a_browser_and_a_server_of_different_versions_say_which_is_older(
        browser: Any, no_card_lab: Any) -> None:  # noqa: F811
    with sidebar_open(browser, no_card_lab) as page:
        sent: list[str | None] = []
        page.page.on("request", lambda request: "/api/tfgpu/" in request.url and sent.append(
            request.headers.get(HEADER.lower())))
        page.page.evaluate("() => { window.jupyterapp.shell.collapseRight(); }")
        page.open_sidebar()
        page.sidebar_says("NVML lists no GPU on this machine.")  # the real server, of the same version: answered
        assert sent and set(sent) == {str(VERSION)}
        assert page.sidebar.locator(".tfgpu-problem-failure-server-older, .tfgpu-problem-failure-browser-older").count() == 0
        for handler, words in ((version_3_gpus_reply, SERVER_OLDER), (newer_server_refusal, BROWSER_OLDER),
                               (older_gpus_reply, SERVER_OLDER)):
            with tfgpu_requests_answered(page, handler):
                page.page.evaluate("() => { window.jupyterapp.shell.collapseRight(); }")
                page.open_sidebar()  # asks again now
                text = page.sidebar_says(words)
                assert ("Reload this page" in text) == (words == BROWSER_OLDER)
                assert ("Install the same tfgpu_magic" in text) == (words == SERVER_OLDER)
