"""tfgpu_magic: control TensorFlow's GPUs from a notebook with `%tfgpu`, before the first op.

`%load_ext tfgpu_magic` in IPython/Jupyter; in a script, `tfgpu_magic.configure("growth on")`
before importing TensorFlow. Importing this package never imports TensorFlow, ipywidgets or NVML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import PolicyError

if TYPE_CHECKING:
    from .language.policy import Policy
    from .tf.apply import ApplyReport

try:  # written by the build from labextension/package.json's version (pyproject.toml, [tool.hatch.version])
    from ._version import __version__
except ImportError:  # a source tree on sys.path that was never built or installed
    __version__ = "0+unknown"
__all__ = ["Policy", "PolicyError", "configure", "current_policy", "memory", "panel", "session_config", "who"]


_LAZY = ("Policy",)
"""Attributes `__getattr__` loads on first use; `__dir__` lists them so Tab completion finds them."""


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def __getattr__(name: str) -> Any:
    """`Policy` loads on first use, keeping `%load_ext` cheap (PEP 562)."""
    if name == "Policy":
        from .language.policy import Policy

        return Policy
    raise AttributeError(f"module 'tfgpu_magic' has no attribute {name!r}")


def get_controller() -> Any:
    """The process-wide controller shared by the magic, the panel and `configure()`, with the views'
    words hooked up (`views.hookup`)."""
    from .views.hookup import shared_controller

    return shared_controller()


def configure(*directives: str) -> ApplyReport:
    """Script form of `%tfgpu`: `configure("growth on", "split cpu 2")` before importing TensorFlow.

    Same directives and timing rules as the magic; bad input raises `PolicyError` and changes nothing.
    """
    wrong = [directive for directive in directives if not isinstance(directive, str)]
    if wrong:
        raise TypeError(f"configure() takes directive strings, e.g. configure(\"growth on\", \"visible 0\"); "
                        f"got {type(wrong[0]).__name__}")
    if not all(directive.strip() for directive in directives):
        raise PolicyError("configure() got an empty directive; give each as text, e.g. configure(\"growth on\")")
    controller = get_controller()
    report = controller.edit(controller.parse(directive) for directive in directives)
    if not report.ok:
        import warnings

        from .views.status import SCRIPT_RESTART_HINT, describe_report

        warnings.warn(describe_report(report, SCRIPT_RESTART_HINT), stacklevel=2)
    return report


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
    Jupyter kernel of this user or holds GPU memory (see docs/who.md)."""
    from .holders import who as rows

    return [row.as_dict() for row in rows(inventory)]


def session_config() -> Any:
    """A `tf.compat.v1.ConfigProto` carrying the policy, for TF1-style `tf.compat.v1.Session`.
    Without TensorFlow installed: a one-line `PolicyError` saying how to install it."""
    from .tf.apply import session_config as build

    controller = get_controller()
    return build(controller.plan(), controller.api)


def panel() -> Any:
    """Show the widget panel over the policy in a notebook; returns the `Panel` (its `.widget`), which
    as the cell's last value adds no `<Panel at 0x…>` line (`Panel._ipython_display_`)."""
    from IPython import get_ipython

    from .views.actions import open_panel

    return open_panel(get_controller(), get_ipython())


def load_ipython_extension(shell: Any) -> None:
    """`%load_ext tfgpu_magic`: register `%tfgpu` and apply the configured default policy."""
    from .views.magics import load

    load(shell)


def unload_ipython_extension(shell: Any) -> None:
    """`%unload_ext tfgpu_magic`: the policy and environment stay as they are."""
