"""`%tfgpu memory`'s per-cell part: for each card, each recent cell's TensorFlow figures (before, peak
during, after) as a table, and in a notebook an inline SVG chart of the same cells (one column per cell:
a bar up to its peak, a line from before to after, the peak's cell marked). The records come from
`tf.cellmemory` (the kernel's own cell hooks); the chart's colours are JupyterLab's theme variables,
with fallbacks for other front ends, and its text equivalent (`summary`) is its `<title>`.
"""

from __future__ import annotations

import html
from typing import NamedTuple, Sequence

from ..language.sizes import bytes_text
from ..tf.cellmemory import CardCell, CellMemory, per_card
from ..tf.memory import GpuMemory

TABLE_CELLS = 12
"""Most recent cells a table lists (the chart shows `CHART_CELLS`)."""
CHART_CELLS = 40
WIDTH, HEIGHT, LABELS = 360, 90, 14
"""The chart's size in px (the bottom `LABELS` px hold the cells' numbers)."""
BRAND = "var(--jp-brand-color1, #1976d2)"
BAND = "var(--jp-layout-color3, #bdbdbd)"
FRAME = "var(--jp-border-color2, #e0e0e0)"
TEXT = "var(--jp-ui-font-color1, #212121)"
MUTED_TEXT = "var(--jp-ui-font-color2, #616161)"
HEADERS = ("cell", "before", "peak during", "after")


class CardCells(NamedTuple):
    """One card's label (`GPU 1`) and its recorded cells, oldest first."""

    label: str
    cells: list[CardCell]


def card_cells(rows: Sequence[GpuMemory], cells: Sequence[CellMemory]) -> list[CardCells]:
    """The cards (`memory_rows`) that have recorded cells, each with them."""
    found = []
    for row in rows:
        mine = per_card(cells, row.logical_devices)
        if mine:
            found.append(CardCells(f"GPU {row.gpu}" if row.gpu is not None else row.tf_device, mine))
    return found


def cell_name(cell: CardCell) -> str:
    """`[3]`; `[?]` for a cell run outside the history (a silent request)."""
    return f"[{cell.execution_count if cell.execution_count is not None else '?'}]"


def peak_cell(cells: Sequence[CardCell]) -> CardCell:
    """The cell with the highest peak (the latest of equal ones)."""
    return max(reversed(cells), key=lambda cell: cell.peak)


def summary(card: CardCells) -> str:
    """The chart in words: `GPU 1, cells [2] to [9]: peak 5.9 GiB during cell [3]; now 2.9 GiB`."""
    first, last, top = card.cells[0], card.cells[-1], peak_cell(card.cells)
    span = f"cell {cell_name(first)}" if first is last else f"cells {cell_name(first)} to {cell_name(last)}"
    return (f"{card.label}, {span}: peak {bytes_text(top.peak)} during cell {cell_name(top)}; "
            f"now {bytes_text(last.after)}")


def table_rows(card: CardCells) -> list[tuple[str, str, str, str]]:
    """The last `TABLE_CELLS` cells as the table's rows (`HEADERS`)."""
    return [(cell_name(cell), bytes_text(cell.before), bytes_text(cell.peak), bytes_text(cell.after))
            for cell in card.cells[-TABLE_CELLS:]]


def text(cards: Sequence[CardCells]) -> str:
    """Per card: the summary, then the last `TABLE_CELLS` cells, columns aligned; '' without records."""
    blocks = []
    for card in cards:
        table = [HEADERS, *table_rows(card)]
        widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
        lines = ["  ".join(part.ljust(width) for part, width in zip(line, widths)).rstrip() for line in table]
        blocks.append("\n".join([f"Per cell, TensorFlow's tensors on {summary(card)}", *lines]))
    return "\n\n".join(blocks)


def chart_svg(card: CardCells) -> str:
    """The last `CHART_CELLS` cells of `card`: a column each (a bar up to the peak; a line from before
    to after), the peak's column in the brand colour with its figure, the cells' numbers below."""
    cells = card.cells[-CHART_CELLS:]
    top = peak_cell(cells)
    scale = max(top.peak, 1)
    step = WIDTH / len(cells)
    plot = HEIGHT - LABELS

    def y(count: int) -> float:
        return round(plot - (plot - 4) * count / scale, 1)

    parts = [f"<line x1='0' y1='{plot}' x2='{WIDTH}' y2='{plot}' style='stroke:{FRAME}'/>"]
    every = max(1, len(cells) // 10)
    for i, cell in enumerate(cells):
        left, colour = round(i * step, 1), BRAND if cell is top else BAND
        tip = f"cell {cell_name(cell)}: before {bytes_text(cell.before)}, peak {bytes_text(cell.peak)}, " \
              f"after {bytes_text(cell.after)}"
        parts.append(f"<rect x='{left + 1}' y='{y(cell.peak)}' width='{max(round(step - 2, 1), 1)}' "
                     f"height='{round(plot - y(cell.peak), 1)}' style='fill:{colour};opacity:.45'>"
                     f"<title>{html.escape(tip)}</title></rect>")
        parts.append(f"<line x1='{left}' y1='{y(cell.before)}' x2='{round(left + step, 1)}' y2='{y(cell.after)}' "
                     f"style='stroke:{BRAND};stroke-width:2'/>")
        if i % every == 0 or cell is top:
            parts.append(f"<text x='{round(left + step / 2, 1)}' y='{HEIGHT - 3}' text-anchor='middle' "
                         f"style='fill:{MUTED_TEXT};font-size:10px'>{html.escape(cell_name(cell))}</text>")
    anchor = "end" if cells.index(top) > len(cells) / 2 else "start"
    at = round((cells.index(top) + (1 if anchor == "end" else 0)) * step, 1)
    parts.append(f"<text x='{at}' y='10' text-anchor='{anchor}' style='fill:{TEXT};font-size:11px'>"
                 f"peak {html.escape(bytes_text(top.peak))} {html.escape(cell_name(top))}</text>")
    words = html.escape(summary(card), quote=True)
    return (f"<svg xmlns='http://www.w3.org/2000/svg' role='img' aria-label='{words}' width='{WIDTH}' "
            f"height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}' style='display:block;margin:2px 0'>"
            f"<title>{words}</title>{''.join(parts)}</svg>")


def html_block(cards: Sequence[CardCells], table_style: str, cell_style: str) -> str:
    """Per card: the summary, the chart, the table of the last `TABLE_CELLS` cells; '' without records."""
    blocks = []
    for card in cards:
        head = "".join(f"<th style='{cell_style}'>{title}</th>" for title in HEADERS)
        body = "".join("<tr>" + "".join(f"<td style='{cell_style}'>{html.escape(part)}</td>" for part in row) + "</tr>"
                       for row in table_rows(card))
        blocks.append(f"<div class='tfgpu-percell'><div>Per cell, TensorFlow's tensors on "
                      f"{html.escape(summary(card))}</div>{chart_svg(card)}"
                      f"<table style='{table_style}'><tr>{head}</tr>{body}</table></div>")
    return "".join(blocks)
