"""The sidebar words a refused request by its error body's `code` (`$defs/error`, the body of every reply of
the server extension that is not 200), not by its HTTP status; the status only where the body is not the
schema's error (a proxy's HTML page).

One JupyterLab without cards (test_labextension.py's `no_card_lab`) and one page on its sidebar, the built
extension as a user gets it. Playwright answers the page's requests with the bodies the handlers send
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

pytestmark = pytest.mark.kernel

FORBIDDEN = "The Jupyter server refused the GPU request: not logged in, or not allowed."
SERVER_ERROR = "The GPU request failed in the Jupyter server."


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
