"""A browser and a server extension of different versions of the contract (the schema's version,
tfgpu_magic/jupyter/tfgpu-state.schema.json `$defs/version`) say which one is older, in one line in the sidebar, in
words.ts's words, instead of misreading each other's replies.

One JupyterLab without cards (test_labextension.py's `no_card_lab`) and one page on its sidebar: the page
sends its version with every request (`x-version-header`) and the real server, of the same version, answers.
Then Playwright answers the page's requests as servers of other versions would: version 3 (no version
check of its own) with a reply as it wrote them, its version ending its `format`, no `version`; an older
server of the `version` field; a newer one with the 409 `version_mismatch` body the handlers send
(tests/test_serverext.py checks that the real handlers send it).

On the same page's server: a refused request is worded by its error body's `code` (`$defs/error`, the body of
every reply of the server extension that is not 200), not by its HTTP status; the status only where the body
is not the schema's error (a proxy's HTML page). Playwright answers with the bodies the handlers send
(tests/test_serverext.py checks that the real handlers send them: a 403 `forbidden` without authentication,
`server_error` for anything else), each checked against the schema, and with each code under a status that
is not its own too: the words follow the code. labextension/src/__tests__/refusals.spec.ts does the same
for every code, in jest.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

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
FORBIDDEN = "The Jupyter server refused the GPU request: not logged in, or not allowed."
SERVER_ERROR = "The GPU request failed in the Jupyter server."


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


def refusal(status: int, code: str, message: str) -> Callable[[Any], None]:
    """The server's refusal: `status` with the error body of `code` (`TFGPUHandler.write_error`)."""
    body = json.dumps(conforms({"code": code, "message": message}, "error"))
    return lambda route: route.fulfill(status=status, content_type="application/json", body=body)


def proxy_page(route: Any) -> None:
    """A proxy in front of the server, answering with its own page: no error body to word."""
    route.fulfill(status=502, content_type="text/html", body="<html><body><h1>502 Bad Gateway</h1></body></html>")


def test_the_sidebar_words_a_refusal_by_its_code_and_a_proxy_page_by_its_status(
        browser: Any, no_card_lab: Any) -> None:  # noqa: F811
    cases = [(refusal(403, "forbidden", "Forbidden"), FORBIDDEN, "Forbidden"),
             (refusal(500, "server_error", "Unhandled error"), SERVER_ERROR, "Unhandled error"),
             (refusal(500, "forbidden", "XSRF cookie does not match"), FORBIDDEN, "XSRF cookie does not match"),
             (refusal(403, "server_error", "odd"), SERVER_ERROR, "odd"),
             (proxy_page, "The GPU request failed (HTTP 502).", "502")]
    with sidebar_open(browser, no_card_lab) as page:
        page.sidebar_says("NVML lists no GPU on this machine.")  # the real server answered
        shown = ""
        for handler, words, tooltip in cases:
            with tfgpu_requests_answered(page, handler):
                page.page.evaluate("() => { window.jupyterapp.shell.collapseRight(); }")
                page.open_sidebar()  # asks again now
                # each case's words or tooltip differ from the one before: this waits for the new answer
                page.page.wait_for_function(
                    "([words, tooltip]) => [...document.querySelectorAll('.tfgpu-problem')].some(problem =>"
                    " problem.textContent.includes(words) && (problem.getAttribute('title') ?? '').includes(tooltip))",
                    arg=[words, tooltip], timeout=30_000)
                shown = page.sidebar.inner_text()
                assert words in shown, shown
                assert (re.search(r"HTTP \d+", shown) is not None) == (handler is proxy_page), shown
        assert "Bad Gateway" not in shown  # the proxy's page is not shown, only its status
