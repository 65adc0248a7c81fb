"""tfgpu_magic: control TensorFlow's GPUs from a notebook with `%tfgpu`, before the first op.

`%load_ext tfgpu_magic` in IPython/Jupyter; in a script, `tfgpu_magic.configure("growth on")`
before importing TensorFlow. Importing this package never imports TensorFlow, ipywidgets or NVML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import PolicyError

if TYPE_CHECKING:
    from .language.policy import Policy

__version__ = "0.1.0"
__all__ = ["Policy", "PolicyError", "configure", "current_policy", "memory", "panel", "session_config", "who"]


_LAZY = ("Policy", "configure")
"""Attributes `__getattr__` loads on first use; `__dir__` lists them so Tab completion finds them."""


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def __getattr__(name: str) -> Any:
    """`Policy` and `configure` load on first use, keeping `%load_ext` cheap (PEP 562)."""
    if name == "Policy":
        from .language.policy import Policy

        return Policy
    if name == "configure":
        from .controller import configure

        return configure
    raise AttributeError(f"module 'tfgpu_magic' has no attribute {name!r}")


def get_controller() -> Any:
    """The process-wide controller shared by the magic, the panel and `configure()`."""
    from .controller import get_controller as shared

    return shared()


def current_policy() -> Policy:
    """The desired policy: an immutable value with `to_dict()` and `Policy.from_dict()`."""
    return get_controller().policy


def memory() -> list[dict]:
    """One plain dict per visible GPU: TensorFlow's tensors now and peak (once initialized), this
    process's memory on the card, the card's total and free, other processes, the cap and its source."""
    from .tf.memory import memory as figures

    return figures(get_controller())


def who(inventory: Any = None) -> list[dict[str, Any]]:
    """Which process holds which GPU, and which notebook it is: one plain dict per process that is a
    Jupyter kernel of this user or holds GPU memory (see the README's "Who holds the GPUs")."""
    from .holders import who as rows

    return rows(inventory)


def session_config() -> Any:
    """A `tf.compat.v1.ConfigProto` carrying the policy, for TF1-style `tf.compat.v1.Session`.
    Without TensorFlow installed: a one-line `PolicyError` saying how to install it."""
    from .tf.runtime import session_config as build

    controller = get_controller()
    return build(controller.plan(), controller.api)


def panel() -> Any:
    """Show the widget panel over the policy in a notebook; returns the `Panel` (its `.widget`), which
    as the cell's last value adds no `<Panel at 0x…>` line (`Panel._ipython_display_`)."""
    from IPython import get_ipython

    from .actions import open_panel

    return open_panel(get_controller(), get_ipython())


def load_ipython_extension(shell: Any) -> None:
    """`%load_ext tfgpu_magic`: register `%tfgpu` and apply the configured default policy."""
    from .views.magics import load

    load(shell)


def unload_ipython_extension(shell: Any) -> None:
    """`%unload_ext tfgpu_magic`: the policy and environment stay as they are."""
