"""The confirmation step of `%tfgpu restart` in a notebook: one button, shown once, and only where
pressing it restarts the kernel (`restart.Route.restarts`; `actions.restart` decides)."""

from __future__ import annotations

from typing import Any, Callable


def whole_layout(**layout: str) -> Any:
    """The layout of a button or checkbox that keeps its whole label: as wide as its label (a button's
    default is 148 px: "Restart kernel and ap…") and never squeezed by its row (which wraps instead)."""
    import ipywidgets as widgets

    return widgets.Layout(width="auto", flex="0 0 auto", **layout)


def show_restart_button(restart: Callable[[], str]) -> None:
    """Display a "Restart kernel and apply" button that calls `restart` once, and its answer."""
    import ipywidgets as widgets
    from IPython.display import display

    button = widgets.Button(description="Restart kernel and apply", button_style="danger", icon="refresh",
                            layout=whole_layout())
    output = widgets.Output()

    def on_click(_: widgets.Button) -> None:
        button.disabled = True
        with output:
            print(restart())

    button.on_click(on_click)
    display(widgets.VBox([button, output], layout=widgets.Layout(align_items="flex-start")))  # not stretched
