"""Results that render once for every front end: plain text in terminal IPython, logs and `str()`,
a compact HTML table in notebooks (state in colour, the locked badge), both from the same data.

`show(value)` is how a view puts an action's answer on screen: text is printed, a `Result` is
published as text/plain and text/html together (a terminal prints the text; `display(result)` gives
the same through `_repr_pretty_` / `_repr_html_`). Nothing here reads the controller: results are
built from snapshots.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any, Callable

from ..gpus.cudaenv import Grant
from ..gpus.inventory import Inventory
from ..language.policy import short_uuid
from ..language.sizes import gib_pair, mib_text
from . import percell
from .percell import CardCells
from .status import StatusSnapshot, kept_text, no_gpus_text, outside_grant, shown_variable, status_text
from .tfstate import state_text

if TYPE_CHECKING:
    from ..doctor import Check
    from ..selftest.report import Row
    from ..tf.initcell import InitRecord
    from ..tf.runtime import RuntimeState

OK_COLOR = "var(--jp-success-color1, #388e3c)"
WARN_COLOR = "var(--jp-warn-color1, #f57c00)"
ERROR_COLOR = "var(--jp-error-color1, #d32f2f)"
MUTED = "opacity:.75"
LOCK_BADGE = (
    f"border:1px solid {WARN_COLOR};color:{WARN_COLOR};"
    "border-radius:3px;padding:0 4px;font-size:90%"
)
TABLE = "border-collapse:collapse;font-size:var(--jp-code-font-size, 13px);margin:2px 0"
CELL = "text-align:left;vertical-align:top;padding:1px 8px 1px 0"
VERDICT_COLORS = {"ok": OK_COLOR, "warn": WARN_COLOR, "FAIL": ERROR_COLOR}
"""The doctor's verdicts (`doctor.OK` ...) in colour; `info` stays in the text colour."""
SELFTEST_COLORS = {"pass": OK_COLOR, "fail": ERROR_COLOR}
"""The selftest's verdicts in colour; `skip` stays in the text colour."""
TOOLTIP_CHARS = 4096
"""Longest text put in a tooltip (an environment variable can hold far more)."""
CODE_SPAN = re.compile(r"`([^`]+)`")
"""Our messages mark code as `...` (what a terminal shows); in HTML it becomes <code>."""


class Result:
    """An action's answer with a text and an HTML form; `str()` is the text. Subclasses define no
    `__repr__`: IPython's pretty printer prefers a class's own `__repr__` to an inherited
    `_repr_pretty_`."""

    __slots__ = ()

    def text(self) -> str:
        raise NotImplementedError

    def html(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.text()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text())

    def _repr_html_(self) -> str:
        return self.html()


def show(value: str | Result | None) -> None:
    """Print text (nothing when empty); send a `Result` to the front end as text/plain and
    text/html together (a terminal prints the text). The bundle is published directly: IPython's
    `display()` would build its formatters and try every one of them on the first call."""
    if isinstance(value, RestartOffer):
        value._ipython_display_()
    elif isinstance(value, Result):
        from IPython.core.interactiveshell import InteractiveShell

        if not InteractiveShell.initialized() or _text_only(InteractiveShell.instance()):
            print(value.text())
            return
        from IPython.display import publish_display_data

        publish_display_data({"text/plain": value.text(), "text/html": value.html()})
    elif value:
        print(value)


def _text_only(shell: Any) -> bool:
    """Terminal IPython's own publisher prints text/plain and drops the rest: no HTML to build there
    (a kernel's, or `capture_output`'s, is another class)."""
    from IPython.core.displaypub import DisplayPublisher

    return type(getattr(shell, "display_pub", None)) is DisplayPublisher


def text_html(text: str) -> str:
    """A message as HTML: escaped, its `code` spans as <code> (an unpaired backtick stays as it is)."""
    return CODE_SPAN.sub(r"<code>\1</code>", html.escape(text))


def code(shown: str, full: str) -> str:
    """`shown` as <code>; the `full` text (a whole UUID) as its tooltip where it differs and is not huge."""
    tip = f" title='{html.escape(full, quote=True)}'" if full != shown and len(full) <= TOOLTIP_CHARS else ""
    return f"<code{tip}>{html.escape(shown)}</code>"


def badge(text: str) -> str:
    """The small outlined label the status and the panel put next to locked settings."""
    return f"<span style='{LOCK_BADGE}'>{html.escape(text)}</span>"


def state_label_html(state: RuntimeState, record: InitRecord | None) -> str:
    """TensorFlow's state in colour (`record`: where it was initialized): orange once GPU memory settings
    are fixed."""
    color = WARN_COLOR if state.gpu_memory_fixed else OK_COLOR
    return f"<span style='color:{color}'>{text_html(state_text(state, record))}</span>"


def state_html(snap: StatusSnapshot) -> str:
    """`state_label_html`, with the badge once locked."""
    return state_label_html(snap.state, snap.initialized_by) + (" " + badge("locked") if snap.locked else "")


def _rows(rows: list[tuple[str, str]]) -> str:
    """A two-column table; values are HTML already."""
    body = "".join(f"<tr><th style='{CELL}'>{text_html(label)}</th><td style='{CELL}'>{value}</td></tr>"
                   for label, value in rows)
    return f"<table style='{TABLE}'>{body}</table>"


def _list(items: tuple[str, ...] | list[str]) -> str:
    return "<ul style='margin:0;padding-left:1.2em'>" + "".join(f"<li>{text_html(i)}</li>" for i in items) + "</ul>"


def gpus_html(inventory: Inventory, grant: Grant = Grant(None)) -> str:
    """The GPU list as a table (nvidia-smi numbering), each card outside the grant muted and marked,
    or why there is none."""
    why = no_gpus_text(inventory)
    if why is not None:
        return text_html(why)
    head = "".join(f"<th style='{CELL}'>{title}</th>" for title in ("GPU", "name", "memory used", "busy", "UUID"))
    lines = [f"<tr>{head}</tr>"]
    for gpu in inventory.gpus:
        outside = outside_grant(gpu, grant)
        procs = f"<br><span style='{MUTED}'>{html.escape(outside)}</span>" if outside else ""
        procs += "".join(f"<br><span style='{MUTED}'>MIG {html.escape(str(mig.uuid))}: "
                         f"{mib_text(mig.memory_total_mib)}</span>"
                         for mig in gpu.mig_devices)
        procs += "".join(f"<br><span style='{MUTED}'>pid {p.pid}: {mib_text(p.used_mib)}"
                         f"{' (this kernel)' if p.is_self else ''}</span>" for p in gpu.processes)
        busy = "" if gpu.utilization_pct is None else f"{gpu.utilization_pct}%"
        cells = [html.escape(str(gpu.index)), html.escape(gpu.name or "GPU") + procs,
                 gib_pair(gpu.memory_used_mib, gpu.memory_total_mib), busy, code(short_uuid(str(gpu.uuid)), str(gpu.uuid))]
        style = f" style='{MUTED}'" if outside else ""
        lines.append(f"<tr{style}>" + "".join(f"<td style='{CELL}'>{cell}</td>" for cell in cells) + "</tr>")
    caption = f"<span style='{MUTED}'>NVML, driver {html.escape(str(inventory.driver_version))}</span>"
    return caption + f"<table style='{TABLE}'>{''.join(lines)}</table>"


class StatusResult(Result):
    """`%tfgpu` status."""

    __slots__ = ("snapshot",)

    def __init__(self, snapshot: StatusSnapshot) -> None:
        self.snapshot = snapshot

    def text(self) -> str:
        return status_text(self.snapshot)

    def html(self) -> str:
        snap = self.snapshot
        env = ", ".join(code(shown_variable(name, value), f"{name}={value}") for name, value in snap.environment)
        rows = [
            ("TensorFlow", state_html(snap)),
            *((label, text_html(line)) for label, line in snap.frameworks),
            ("Policy", text_html("; ".join(snap.policy)) if snap.policy else "none (TensorFlow defaults)"),
            ("Variables", env or "none set"),
        ]
        if snap.kept is not None:
            rows.insert(-1, ("Kept", text_html(kept_text(snap.kept))))
        rows += [("", text_html(line)) for line in snap.cuda_visible]
        rows.append(("GPUs", gpus_html(snap.inventory, snap.grant)))
        if snap.recorded is not None:
            rows.append(("Recorded", _list(snap.recorded) if snap.recorded else "nothing yet (devices not listed)"))
        for title, items in snap.pending:
            rows.append((title, f"<span style='color:{WARN_COLOR}'>{_list(items)}</span>"))
        rows += [("Note", text_html(note)) for note in snap.notes]
        return f"<div class='tfgpu-status'><b>tfgpu</b>{_rows(rows)}</div>"


class DoctorResult(Result):
    """`%tfgpu doctor`: the checks in order, each with its verdict and fix, and a closing sentence."""

    __slots__ = ("checks",)

    def __init__(self, checks: tuple[Check, ...]) -> None:
        self.checks = checks

    def text(self) -> str:
        from .doctor import report_text

        return report_text(list(self.checks))

    def html(self) -> str:
        from ..doctor import FAIL
        from .doctor import summary

        lines = []
        for check in self.checks:
            color = VERDICT_COLORS.get(check.verdict, "inherit")
            fix = f"<br><span style='{MUTED}'>fix: {text_html(check.fix)}</span>" if check.fix else ""
            lines.append(f"<tr><td style='{CELL};color:{color};font-weight:bold'>{html.escape(check.verdict)}</td>"
                         f"<th style='{CELL}'>{html.escape(check.name)}</th>"
                         f"<td style='{CELL}'>{text_html(check.detail)}{fix}</td></tr>")
        failed = any(check.verdict == FAIL for check in self.checks)
        verdict = f"<p style='color:{ERROR_COLOR if failed else OK_COLOR};margin:4px 0'>"
        return (f"<div class='tfgpu-doctor'><table style='{TABLE}'>{''.join(lines)}</table>"
                f"{verdict}{text_html(summary(list(self.checks)))}</p></div>")


class SelftestResult(Result):
    """`%tfgpu selftest`: a table, one row per rule (verdict, rule and claim, policy, expected, measured,
    why, seconds), under which Python and TensorFlow it ran and above the counts."""

    __slots__ = ("rows", "seconds")

    def __init__(self, rows: tuple[Row, ...], seconds: float) -> None:
        self.rows = rows
        self.seconds = seconds

    def text(self) -> str:
        from .selftest import text

        return text(list(self.rows), self.seconds)

    def html(self) -> str:
        from .selftest import header, summary

        titles = ("", "rule", "policy", "expected", "measured", "why", "s")
        lines = ["<tr>" + "".join(f"<th style='{CELL}'>{title}</th>" for title in titles) + "</tr>"]
        for row in self.rows:
            color = SELFTEST_COLORS.get(row.verdict, "inherit")
            cells = [f"{html.escape(row.rule)}<br><span style='{MUTED}'>{html.escape(row.claim)}</span>",
                     html.escape("; ".join(row.policy)), html.escape(row.expected), html.escape(row.measured),
                     html.escape(row.why), "" if row.verdict == "skip" else f"{row.seconds:.1f}"]
            lines.append(f"<tr><td style='{CELL};color:{color};font-weight:bold'>{html.escape(row.verdict)}</td>"
                         + "".join(f"<td style='{CELL}'>{cell}</td>" for cell in cells) + "</tr>")
        rows = list(self.rows)
        return (f"<div class='tfgpu-selftest'><b>{html.escape(header(rows))}</b>"
                f"<table style='{TABLE}'>{''.join(lines)}</table>"
                f"<p style='margin:4px 0'>{html.escape(summary(rows, self.seconds))}</p></div>")


class MemoryResult(Result):
    """`%tfgpu memory`: the figures per GPU (`figures.memory_text`), then per card each recent cell's
    figures (`percell`): a table in text; in a notebook the same with a chart per card."""

    __slots__ = ("figures", "cards")

    def __init__(self, figures: str, cards: list[CardCells]) -> None:
        self.figures = figures
        self.cards = cards

    def text(self) -> str:
        return "\n\n".join(part for part in (self.figures, percell.text(self.cards)) if part)

    def html(self) -> str:
        return (f"<div class='tfgpu-memory'><pre style='margin:0'>{html.escape(self.figures)}</pre>"
                f"{percell.html_block(self.cards, TABLE, CELL)}</div>")


class RestartOffer(Result):
    """`%tfgpu restart` where a restart is possible: what it costs, and a button that restarts once
    (`display()` calls `_ipython_display_`, which shows both)."""

    __slots__ = ("message", "restart")

    def __init__(self, message: str, restart: Callable[[], str]) -> None:
        self.message = message
        self.restart = restart

    def text(self) -> str:
        return self.message

    def html(self) -> str:
        return f"<pre>{text_html(self.message)}</pre>"

    def _ipython_display_(self) -> None:
        from .confirm import show_restart_button

        print(self.message)
        show_restart_button(self.restart)
