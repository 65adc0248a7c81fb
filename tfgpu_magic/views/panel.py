"""`%tfgpu panel`: an ipywidgets view over the controller, two-way synced with the magic.

Every panel edit is turned into a directive and goes through the same grammar and validation as
`%tfgpu`, so a bad value gives the magic's one-line message and changes nothing. Every controller
change (from the magic, another panel or a restart) refreshes every open panel. ipywidgets is
imported only when a panel is built.

The panel reads and edits only through the controller's public methods (the same ones the magic's
actions use); the restart it is given comes from `actions.open_panel`, so it imports neither the
actions nor the magic.
"""

from __future__ import annotations

import html
import threading
from typing import Any, Callable

from ..controller import Controller, ListedGpu
from ..errors import PolicyError
from ..gpus.inventory import Gpu
from .restarting import TO_DO_FRONTEND, command_sentence
from ..language.directives import LOGLEVEL_OFF
from ..language.grammar import Edit, default_edit
from ..language.policy import LOGLEVELS
from ..language.words import ALLOCATORS
from ..tf.initcell import initialized_record
from ..language.sizes import directive_size, gib_pair, mib_count, mib_text, split_size
from .confirm import whole_layout
from .results import badge, state_label_html, text_html
from .hookup import shared_controller
from .status import describe_report, no_gpu_reason, note_text, notebook_notes, pending_lines

REFRESH_SECONDS = 2.0
LOCKED_REASON = "TensorFlow is initialized: edits below are recorded and apply with Restart kernel and apply"
BAR_CSS = (
    "display:inline-flex;width:60px;height:10px;border-radius:3px;vertical-align:middle;"
    "background:var(--jp-layout-color3, #ddd);overflow:hidden"
)
YOU_COLOR = "var(--jp-accent-color1, #388e3c)"
OTHERS_COLOR = "var(--jp-brand-color1, #1976d2)"
CELL_CSS = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis;font-variant-numeric:tabular-nums"
TEXT_TRACK = "minmax(0, max-content)"
INPUT_WIDTH = "68px"
COLUMNS = (("visible", "max-content"), ("card", TEXT_TRACK), ("memory", TEXT_TRACK), ("busy", "max-content"),
           ("processes", TEXT_TRACK), ("limit", INPUT_WIDTH), ("split", INPUT_WIDTH))
"""The GPU table's columns (one grid, so every card's row lines up like nvitop's table). Text columns
take their content's width while there is room and share what there is when there is not (the cell
then ends in "…", its tooltip whole), so the table fits JupyterLab at 1280 px with the file browser
open (about 830 px for an output) and never scrolls sideways."""
WRAP = "row wrap"
"""Rows of controls wrap onto a second line in a narrow notebook instead of squeezing their labels."""


def _cell(text: str, title: str = "") -> str:
    tip = f" title='{html.escape(title, quote=True)}'" if title else ""
    return f"<div style='{CELL_CSS}'{tip}>{text}</div>"


def own_mib(gpu: Gpu | None) -> int:
    """MiB this kernel's process holds on `gpu` (NVML's process list; 0 when absent or unknown)."""
    return sum(p.used_mib or 0 for p in gpu.processes if p.is_self) if gpu is not None else 0


def memory_bar(row: ListedGpu, gpu: Gpu | None = None) -> str:
    """A bar of used/total memory, this kernel's share in its own colour, and `20.0 / 80 GiB`;
    themed with JupyterLab's CSS variables."""
    if row.total_mib is None or row.used_mib is None:
        return _cell("<span style='opacity:.7'>memory unknown</span>")
    total = max(row.total_mib, 1)
    mine = min(own_mib(gpu), row.used_mib)
    segments = "".join(f"<span style='display:block;width:{100 * mib / total:.1f}%;min-width:3px;height:100%;"
                       f"background:{color}'></span>"
                       for mib, color in ((mine, YOU_COLOR), (row.used_mib - mine, OTHERS_COLOR)) if mib > 0)
    return _cell(f"<span style='{BAR_CSS}'>{segments}</span> {gib_pair(row.used_mib, row.total_mib)}",
                 f"{mib_count(row.used_mib, grouped=True)} of {mib_count(row.total_mib, grouped=True)} MiB used")


def busy_text(gpu: Gpu | None) -> str:
    """NVML's utilization as `35%` under the "busy" header; a dash when NVML does not say."""
    if gpu is None or gpu.utilization_pct is None:
        return _cell("<span style='opacity:.6'>–</span>", "utilization unknown")
    return _cell(f"{gpu.utilization_pct}%", f"{gpu.utilization_pct}% busy (NVML's utilization)")


def processes_text(gpu: Gpu | None) -> str:
    """Who holds the card: this kernel's share first (`you: 1.0 GiB`), then the other processes."""
    if gpu is None:
        return _cell("")
    others = [p for p in gpu.processes if p.is_self is not True]  # None: a host pid, whose owner is unknown here
    mine = len(others) < len(gpu.processes)
    parts = [f"<b style='color:{YOU_COLOR}'>you: {mib_text(own_mib(gpu))}</b>"] if mine else []
    if others:
        held = sum(p.used_mib or 0 for p in others)
        parts.append(f"{len(others)} other{'s' if len(others) > 1 else ''}: {mib_text(held)}")
    title = ", ".join(f"pid {p.pid}{' (this kernel)' if p.is_self else ''}: {mib_text(p.used_mib)}"
                      for p in gpu.processes)
    return _cell(" · ".join(parts) or "<span style='opacity:.6'>no processes</span>", title)


def card_text(row: ListedGpu, gpu: Gpu | None) -> str:
    """The card's name without the vendor prefix, and its MIG instances when it is split."""
    name = row.name.removeprefix("NVIDIA ")
    migs = len(gpu.mig_devices) if gpu is not None else 0
    mig = f" <span style='opacity:.7'>· MIG ×{migs}</span>" if migs else ""
    return _cell(f"{html.escape(name)}{mig}", row.name)


def limit_text(mib: int | None) -> str:
    """A limit as the grammar writes it ('' for none)."""
    return "" if mib is None else directive_size(mib)


def split_text(sizes: tuple[int, ...] | None) -> str:
    """A split as the grammar writes it ('' for none)."""
    return split_size(sizes) if sizes else ""


class Panel:
    """One displayed panel. `widget` is the ipywidgets tree; `close()` detaches it."""

    def __init__(self, controller: Controller | None = None, shell: Any = None,
                 restart: Callable[[], str] | None = None, restarts: bool = True,
                 who: Callable[[], str] | None = None) -> None:
        """`restart` stores the policy and restarts the kernel; `restarts` says whether anything will
        bring the kernel back here (else the button only keeps the policy for a front-end restart);
        `who` gives the "Who holds the GPUs" text, read only while that section is open."""
        import ipywidgets as w

        self.w = w
        self.controller = controller or shared_controller()
        self.shell = shell
        self.restart = restart
        self._syncing = False
        self.message = ""
        self._refresher: threading.Thread | None = None
        self._stop = threading.Event()
        self._layout: list[Any] | None = None
        """The live figures' rows as the last full look read them (`refresh_memory`)."""
        self.rows, why = self.controller.gpus()
        self.no_gpu_reason = no_gpu_reason(why)

        self.header = w.HTML()
        self.error = w.HTML()
        labelled = {"style": {"description_width": "initial"}, "layout": w.Layout(width="auto")}
        self.growth = w.Dropdown(options=[("TF default", "default"), ("on", "on"), ("off", "off")],
                                 description="Growth", **labelled)
        self.allocator = w.Dropdown(options=[("TF default", "default"), *((name, name) for name in ALLOCATORS)],
                                    description="Allocator", **labelled)
        self.loglevel = w.Dropdown(options=[("TF default", LOGLEVEL_OFF), *((level, level) for level in LOGLEVELS)],
                                   description="Log level", **labelled)
        self.cpus = w.Text(placeholder="TF default", description="CPU devices", continuous_update=False,
                           style={"description_width": "initial"}, layout=w.Layout(width="180px"))
        self.visible = {row.ref: w.Checkbox(description=f"<b>GPU {html.escape(row.ref)}</b>",
                                            description_allow_html=True, indent=False,
                                            tooltip="visible to TensorFlow (%tfgpu visible)",
                                            layout=w.Layout(width="auto"))
                        for row in self.rows}
        self.limits = {row.ref: w.Text(placeholder="no limit", layout=w.Layout(width="auto"),
                                       continuous_update=False) for row in self.rows}
        self.splits = {row.ref: w.Text(placeholder="no split", layout=w.Layout(width="auto"),
                                       continuous_update=False) for row in self.rows}
        self.bars = {row.ref: w.HTML() for row in self.rows}
        self.busy = {row.ref: w.HTML() for row in self.rows}
        self.holders = {row.ref: w.HTML() for row in self.rows}
        self._shown_in: int | None = None
        self.apply_button = w.Button(description="Apply", icon="check", layout=whole_layout())
        self.restarts = restarts
        self.restart_button = w.Button(
            description="Restart kernel and apply" if restarts else "Keep for the next restart",
            tooltip=(command_sentence(shell) or None) if restarts
            else f"Nothing here can restart this kernel: {TO_DO_FRONTEND}",
            icon="refresh", button_style="warning", layout=whole_layout())
        self.confirm_button = w.Button(description="Yes, restart (variables are lost)", button_style="danger",
                                       layout=whole_layout(display="none"))
        self.cancel_button = w.Button(description="Cancel", layout=whole_layout(display="none"))
        self.export_button = w.Button(description="Export", icon="code", layout=whole_layout())
        self.reset_button = w.Button(description="Reset", icon="undo", layout=whole_layout())
        self.live = w.Checkbox(description="live memory", indent=False, value=False, layout=whole_layout())
        self.output = w.Output()
        self.who = who
        self.who_text = w.HTML()
        self.figures = w.HTML()
        self.who_section = w.Accordion(children=[self.who_text], selected_index=None)
        self.who_section.set_title(0, "Who holds the GPUs")
        self.who_section.layout.display = "" if who is not None else "none"
        self.table = self._gpu_box()
        controls = w.HBox([self.growth, self.allocator, self.loglevel, self.cpus],
                          layout=w.Layout(flex_flow=WRAP, grid_gap="0 12px"))  # grid-gap is `gap`, flex's too
        buttons = w.HBox([self.apply_button, self.restart_button, self.confirm_button, self.cancel_button,
                          self.export_button, self.reset_button, self.live], layout=w.Layout(flex_flow=WRAP))
        self.widget = w.VBox([self.header, self.table, controls, buttons,
                              self.figures, self.who_section, self.error, self.output],
                             layout=w.Layout(border="1px solid var(--jp-border-color2, #ccc)", padding="6px"))
        self._wire()
        self.sync()
        self.refresh_memory()
        self.controller.subscribe(self._on_controller_change)

    # ----- layout --------------------------------------------------------------------------
    def _gpu_box(self) -> Any:
        w = self.w
        if not self.rows:
            return w.HTML(f"<i>{text_html(self.no_gpu_reason)}</i>")
        gpus = {gpu.ref: gpu for gpu in self.controller.inventory().gpus}
        cells = [w.HTML(_cell(f"<span style='opacity:.7'>{title}</span>")) for title, _ in COLUMNS]
        for row in self.rows:
            cells += [self.visible[row.ref], w.HTML(card_text(row, gpus.get(row.ref))), self.bars[row.ref],
                      self.busy[row.ref], self.holders[row.ref], self.limits[row.ref], self.splits[row.ref]]
        for cell in cells:
            cell.layout.margin = "0"
            if isinstance(cell, w.HTML):  # a one-track grid lets the text inside shrink below its width: "…"
                cell.layout.display = "grid"
                cell.layout.grid_template_columns = "minmax(0, 1fr)"
        return w.GridBox(cells, layout=w.Layout(
            grid_template_columns=" ".join(width for _, width in COLUMNS), grid_gap="2px 8px",
            align_items="center", margin="4px 0"))

    def _wire(self) -> None:
        self.who_section.observe(lambda c: self.refresh_who(), "selected_index")
        self.growth.observe(lambda c: self._edit(f"growth {c['new']}" if c["new"] != "default"
                                                 else default_edit("growth")), "value")
        self.allocator.observe(lambda c: self._edit(f"allocator {c['new']}" if c["new"] != "default"
                                                    else default_edit("allocator")), "value")
        self.loglevel.observe(lambda c: self._edit(f"loglevel {c['new']}"), "value")
        self.cpus.observe(lambda c: self._edit(f"split cpu {c['new'].strip()}" if c["new"].strip()
                                               else "split off cpu"), "value")
        for ref in self.visible:
            self.visible[ref].observe(lambda c: self._edit(self._visible_directive()), "value")
            self.limits[ref].observe(lambda c, ref=ref: self._edit(self._limit_directive(ref, c["new"])), "value")
            self.splits[ref].observe(lambda c, ref=ref: self._edit(self._split_directive(ref, c["new"])), "value")
        self.apply_button.on_click(lambda _: self._show(describe_report(self.controller.apply())))
        self.restart_button.on_click(lambda _: self._ask_restart(True) if self.restarts else self._do_restart())
        self.cancel_button.on_click(lambda _: self._ask_restart(False))
        self.confirm_button.on_click(lambda _: self._do_restart())
        self.export_button.on_click(lambda _: self._show(self.controller.export(words=note_text)))
        self.reset_button.on_click(lambda _: self._edit("reset"))
        self.live.observe(lambda c: self.set_live(c["new"]), "value")

    # ----- edits ---------------------------------------------------------------------------
    def _named(self, ref: str) -> str:
        """How a directive names the card of row `ref` (its nvidia-smi index): by that index, or, in a
        kernel started with a grant, where an index counts within the grant, by the card's UUID."""
        if not self.controller.grant().restricts:
            return ref
        return next((gpu.uuid for gpu in self.controller.inventory().gpus if gpu.ref == ref), ref)

    def _visible_directive(self) -> str:
        chosen = [self._named(ref) for ref, box in self.visible.items() if box.value]
        if len(chosen) == len(self.visible):
            return "visible all"
        return f"visible {','.join(chosen)}" if chosen else "visible none"

    def _limit_directive(self, ref: str, text: str) -> str:
        return f"limit {text.strip()} {self._named(ref)}" if text.strip() else f"limit off {self._named(ref)}"

    def _split_directive(self, ref: str, text: str) -> str:
        return f"split {self._named(ref)} {text.strip()}" if text.strip() else f"split off {self._named(ref)}"

    def _edit(self, directive: str | Edit) -> None:
        """Send one directive (or the grammar's edit back to TF's default) through the grammar's edit
        path; on error show the magic's message and revert."""
        if self._syncing:
            return
        try:
            edit = directive if isinstance(directive, Edit) else self.controller.parse(directive)
            report = self.controller.edit([edit])
        except PolicyError as err:
            self.error.value = f"<span style='color:var(--jp-error-color1, #d32f2f)'>{text_html(str(err))}</span>"
            self.sync()
            return
        self.error.value = ""
        if not report.ok:
            self._show(describe_report(report))

    # ----- restart -------------------------------------------------------------------------
    def _ask_restart(self, asking: bool) -> None:
        self.confirm_button.layout.display = "" if asking else "none"
        self.cancel_button.layout.display = "" if asking else "none"
        self.restart_button.layout.display = "none" if asking else ""

    def _do_restart(self) -> None:
        self._ask_restart(False)
        if self.restart is None:
            self._show("Restart needs a Jupyter kernel.")
            return
        self._show(self.restart())

    # ----- refresh -------------------------------------------------------------------------
    def sync(self) -> None:
        """Make every control show the controller's state; observers stay quiet meanwhile."""
        policy, state = self.controller.policy, self.controller.state()
        self._syncing = True
        try:
            self.growth.value = "default" if policy.growth is None else ("on" if policy.growth else "off")
            self.allocator.value = policy.allocator or "default"
            self.loglevel.value = policy.loglevel or LOGLEVEL_OFF
            self.cpus.value = str(policy.cpu_devices or "")
            for ref, gpu in self.controller.gpu_settings(self.visible).items():
                self.visible[ref].value = gpu.visible
                self.limits[ref].value = limit_text(gpu.limit_mib)
                self.splits[ref].value = split_text(gpu.split)
        finally:
            self._syncing = False
        locked = state.initialized
        self.apply_button.disabled = locked or not state.imported
        self.apply_button.tooltip = ("TensorFlow is initialized: only a restart applies changes" if locked
                                     else "TensorFlow is not imported: the policy applies on import"
                                     if not state.imported else "apply the policy now")
        for control in [self.growth, self.allocator, self.loglevel, self.cpus, *self.limits.values(), *self.splits.values()]:
            control.tooltip = LOCKED_REASON if locked else None
        self.header.value = self._header_html(state)

    def _header_html(self, state: Any) -> str:
        lines = [f"<b>tfgpu</b> · TensorFlow: {state_label_html(state, initialized_record())}"]
        if state.gpu_memory_fixed:
            reason = LOCKED_REASON if state.initialized else "GPU memory settings wait for Restart kernel and apply"
            lines.append(f"{badge('locked')} {reason}")
        for title, items in pending_lines(self.controller, state):
            entries = "".join(f"<li>{text_html(item)}</li>" for item in items)
            lines.append(f"{text_html(title)}:<ul style='margin:2px 0'>{entries}</ul>")
        lines += [f"{badge('notebook')} {text_html(note)}" for note in notebook_notes(self.controller)]
        return "<br>".join(lines)

    def refresh_who(self) -> None:
        """Re-read who holds the GPUs into the open section (nothing is read while it is closed)."""
        if self.who is not None and self.who_section.selected_index == 0:
            self.who_text.value = f"<pre style='margin:0'>{html.escape(self.who())}</pre>"

    def refresh_memory(self) -> None:
        """Re-read memory, utilization and processes (NVML) into the rows; with live memory ticked,
        TensorFlow's figures and the cap too (`%tfgpu memory`'s, never initializing TensorFlow), under
        the table."""
        from ..tf.memory import memory_rows

        self._layout = memory_rows(self.controller) if self.live.value else None
        self._show_memory(self._layout or [])

    def refresh_figures(self) -> None:
        """The live refresh's look: only the figures shown (NVML's, TensorFlow's tensor counts) on the
        layout the last full look read (`views.watch.with_tensor_figures`), never the plan; a full look
        where there is no layout yet, the policy changed, or the runtime was initialized since."""
        from ..tf.memory import TensorFlowMemory
        from .watch import with_tensor_figures

        rows = with_tensor_figures(self._layout, TensorFlowMemory()) if self._layout is not None else None
        if rows is None:
            self.refresh_memory()
        else:
            self._show_memory(rows)

    def _show_memory(self, memory: list[Any]) -> None:
        """The rows' NVML figures, and under the table TensorFlow's figures of `memory` (`GpuMemory`s)."""
        from .figures import summary

        rows, _ = self.controller.gpus()
        gpus = {gpu.ref: gpu for gpu in self.controller.inventory().gpus}
        figures = {row.gpu: summary(row) for row in memory}
        for row in rows:
            if row.ref in self.bars:
                gpu = gpus.get(row.ref)
                self.bars[row.ref].value = memory_bar(row, gpu)
                self.busy[row.ref].value = busy_text(gpu)
                self.holders[row.ref].value = processes_text(gpu)
        self.figures.value = "".join(f"<div style='{CELL_CSS};opacity:.8'>GPU {html.escape(ref)}: "
                                     f"{html.escape(text)}</div>"
                                     for ref, text in figures.items())

    def set_live(self, on: bool) -> None:
        """Start or stop the live memory refresh; nothing runs while it is off."""
        self._stop.set()
        self._refresher = None
        if on:
            self._stop = threading.Event()
            self._refresher = threading.Thread(target=self._refresh_loop, args=(self._stop,), daemon=True)
            self._refresher.start()

    def _refresh_loop(self, stop: threading.Event) -> None:
        while not stop.wait(REFRESH_SECONDS):
            self.refresh_figures()

    def _on_controller_change(self, controller: Controller) -> None:
        self._layout = None  # the caps follow the policy: the next look reads them anew
        self.sync()

    def _show(self, text: str) -> None:
        self.message = text
        self.output.clear_output()
        with self.output:
            print(text)

    def _ipython_display_(self) -> None:
        """As a cell's value (`tfgpu_magic.panel()` last in a cell) the panel adds nothing where it was
        just shown; in a later cell it shows its widget again."""
        from IPython.display import display

        if self.shell is None or getattr(self.shell, "execution_count", None) != self._shown_in:
            display(self.widget)

    def close(self) -> None:
        """Stop refreshing, stop listening, close the widgets."""
        self.set_live(False)
        self.controller.unsubscribe(self._on_controller_change)
        self.widget.close()


_open_panels: list[Panel] = []


def refresh_open_panels(*_: Any) -> None:
    """post_run_cell hook, registered only while a panel is open: TF's state, and who holds which GPU
    memory (NVML, cached for a couple of seconds), may have changed."""
    for panel in list(_open_panels):
        panel.sync()
        panel.refresh_memory()


def show_panel(controller: Controller, shell: Any, restart: Callable[[], str] | None, restarts: bool,
               who: Callable[[], str] | None = None) -> Panel:
    """Build and display a panel whose restart button calls `restart` (`actions.open_panel` gives the
    one that restarts `shell`'s kernel); keeps open panels in sync with TF's state after each cell."""
    from IPython.display import display

    panel = Panel(controller, shell, restart, restarts, who)
    _open_panels.append(panel)
    if shell is not None and len(_open_panels) == 1:
        shell.events.register("post_run_cell", refresh_open_panels)

    def forget(_: Any) -> None:
        panel.close()
        if panel in _open_panels:
            _open_panels.remove(panel)
        if shell is not None and not _open_panels:
            shell.events.unregister("post_run_cell", refresh_open_panels)

    panel.widget.observe(lambda change: forget(change) if change["new"] is None else None, "comm")
    display(panel.widget)
    panel._shown_in = getattr(shell, "execution_count", None)
    return panel
