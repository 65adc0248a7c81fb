"""Each notebook's GPU memory over time in the JupyterLab sidebar (labextension/src/chart.tsx, history.ts):
a real JupyterLab in headless Chromium, the server extension's history (tfgpu_magic/serverext/history.py)
over the fake four-card NVML, with test_labextension.py's server, page and notebook (fixtures imported,
not copied): the notebook's kernel has run TensorFlow (CPU) and sits on GPU 1 with 2 GiB.

While a cell of that kernel sleeps, the test moves the kernel's memory on the fake card up to 6 GiB and
back down to 3 GiB; the notebook's chart on GPU 1 then says, in its text equivalent, the peak and the
cell it came in. A second kernel of the server on the same card gets its own chart. The poll asks the
server only for what is new (`?since=`). The keyboard walks the points. Screenshots of the chart in the
light and dark themes go to docs/ only with TFGPU_SCREENSHOTS=docs (`make screenshots`).

What this cannot show: real cards. The figures are the fake NVML's, placed by the test.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from servers import wait_until
from test_labextension import GIB, Lab, Page, browser, lab, page, shots  # noqa: F401 (fixtures)

from tfgpu_magic.language.sizes import MIB, bytes_text

pytestmark = pytest.mark.kernel

SLEEP_S = 16
"""The sleeping cell: long enough for a few of the sidebar's polls (3 s) at each figure."""
PEAK_MIB, AFTER_MIB, SECOND_MIB = 6 * GIB, 3 * GIB, GIB
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}


def card(page: Page, index: int) -> Any:
    return page.sidebar.locator(".tfgpu-gpu-card").nth(index)


def chart_says(chart: Any, pattern: str, timeout: float = 40) -> str:
    """The chart's text equivalent (its `aria-label`) once it matches `pattern`."""
    seen: list[str | None] = [None]

    def said() -> str | None:
        seen[0] = chart.get_attribute("aria-label") if chart.count() else None
        return seen[0] if seen[0] and re.search(pattern, seen[0]) else None

    try:
        return wait_until(said, timeout, f"a chart saying {pattern!r}")
    except TimeoutError as err:
        raise TimeoutError(f"{err} (it says {seen[0]!r})") from None


def run_while_moving(lab: Lab) -> tuple[int, int]:
    """Run a sleeping cell in the notebook's kernel (through a second client: the kernel counts it like
    any cell); while it runs, its memory on GPU 1 goes to `PEAK_MIB`, then down to `AFTER_MIB`. The
    kernel's pid and the cell's execution count."""
    kernel = lab.kernel()
    try:
        pid = kernel.pid()
        msg_id = kernel.client.execute(f"import time; time.sleep({SLEEP_S})")
        start = time.monotonic()
        time.sleep(3)
        lab.place(pid, 1, PEAK_MIB)
        time.sleep(7)
        lab.place(pid, 1, AFTER_MIB)
        while True:
            reply = kernel.client.get_shell_msg(timeout=SLEEP_S + 30)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert time.monotonic() - start >= SLEEP_S - 1 and reply["content"]["status"] == "ok"
        return pid, reply["content"]["execution_count"]
    finally:
        kernel.close()


def test_the_notebooks_chart_gives_the_peak_and_the_cell_it_came_in(lab: Lab, page: Page, shots: Path) -> None:
    page.open_sidebar()
    this = card(page, 1).locator(".tfgpu-this")
    this.wait_for()
    pid, count = run_while_moving(lab)
    chart = this.locator(".tfgpu-history-chart")
    peak, now = bytes_text(PEAK_MIB * MIB), bytes_text(AFTER_MIB * MIB)
    said = chart_says(chart, rf"peak {re.escape(peak)} during cell \[{count}\]; now {re.escape(now)}$")
    assert re.fullmatch(rf"last \d+ (s|min): peak {re.escape(peak)} during cell \[{count}\]; now {re.escape(now)}", said)
    assert chart.locator("title").text_content() == said  # the same words for a pointer's tooltip
    assert this.locator(".tfgpu-history-text").inner_text() == said  # and on screen
    assert chart.get_attribute("role") == "slider" and chart.get_attribute("tabindex") == "0"
    bands = chart.locator(".tfgpu-history-cell text")
    assert f"[{count}]" in bands.all_text_contents()  # the cell's band, numbered
    for theme in ("light", "dark"):
        page.run("apputils:change-theme", theme=THEMES[theme])
        page.page.wait_for_function("(light) => document.body.dataset.jpThemeLight === light", arg=str(theme == "light").lower())
        chart.hover(position={"x": chart.bounding_box()["width"] * 0.55, "y": 20})
        card(page, 1).screenshot(path=str(shots / f"labextension-history-{theme}.png"))
    page.run("apputils:change-theme", theme=THEMES["light"])


def test_the_keyboard_walks_the_points_and_says_each_ones_time_figure_and_cell(page: Page) -> None:
    chart = card(page, 1).locator(".tfgpu-this .tfgpu-history-chart")
    readout = card(page, 1).locator(".tfgpu-this .tfgpu-history-readout")
    page.page.mouse.move(0, 0)  # off the chart: a pointer leaving it drops the chosen point
    chart.focus()
    page.page.keyboard.press("End")
    last = wait_until(readout.inner_text, 5, "the readout after End")
    assert re.fullmatch(rf"\S+.* · {re.escape(bytes_text(AFTER_MIB * MIB))} · (cell \[\d+\]|no cell running)", last), last
    assert chart.get_attribute("aria-valuetext") == last
    page.page.keyboard.press("Home")
    first = wait_until(lambda: readout.inner_text() if chart.get_attribute("aria-valuenow") == "0" else "", 5,
                       "the readout after Home")
    assert first != last
    moved = []
    for _ in range(40):  # along the points to the peak's
        page.page.keyboard.press("ArrowRight")
        moved.append(readout.inner_text())
    assert any(f" · {bytes_text(PEAK_MIB * MIB)} · cell [" in said for said in moved), moved


def test_the_poll_asks_only_for_what_is_new(page: Page) -> None:
    """Every request about the kernel after its first carries `since`, the last answer's time, growing."""
    asked = [parse_qs(urlsplit(url).query).get("since") for _, url in page.requests if "/api/tfgpu/kernels/" in url]
    assert len(asked) > 5 and asked[0] is None, asked[:3]
    later = [float(since[0]) for since in asked[1:] if since]
    assert len(later) >= len(asked) - 3, asked  # the first of each kernel (and of a fresh buffer) has none
    assert later == sorted(later)


def test_each_notebook_on_the_card_gets_its_own_chart(lab: Lab, page: Page) -> None:
    """A second kernel of the server on GPU 1 (not tfgpu_magic's, no cells published): its row has a chart
    too, from NVML's figure alone."""
    session = lab.server.request("POST", "api/sessions", {"path": "second.ipynb", "type": "notebook", "name": "second.ipynb",
                                                          "kernel": {"name": "python3"}})
    second = lab.server.connect(session["kernel"]["id"])
    try:
        lab.place(second.pid(), 1, SECOND_MIB)
        row = card(page, 1).locator(".tfgpu-process", has_text="second.ipynb")
        said = chart_says(row.locator(".tfgpu-history-chart"), rf"now {re.escape(bytes_text(SECOND_MIB * MIB))}$")
        assert f"peak {bytes_text(SECOND_MIB * MIB)}" in said
        assert card(page, 1).locator(".tfgpu-history-chart").count() == 2
    finally:
        second.close()
        lab.server.request("DELETE", f"api/sessions/{session['id']}")


def test_a_restarted_kernel_starts_a_fresh_chart(lab: Lab, page: Page) -> None:
    """Last: after a restart (same kernel id, another pid) the chart holds only the new kernel's figures;
    the 6 GiB peak of the old one is gone."""
    from servers import await_new_kernel

    kernel = lab.kernel()
    old_pid = kernel.pid()
    lab.server.request("POST", f"api/kernels/{kernel.kernel_id}/restart")
    kernel = await_new_kernel(kernel, old_pid)
    try:
        lab.place(kernel.pid(), 1, SECOND_MIB)
    finally:
        kernel.close()
    chart = card(page, 1).locator(".tfgpu-this .tfgpu-history-chart")
    small = re.escape(bytes_text(SECOND_MIB * MIB))
    said = chart_says(chart, rf"peak {small} .*now {small}$")
    assert bytes_text(PEAK_MIB * MIB) not in said
