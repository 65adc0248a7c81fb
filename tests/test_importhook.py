"""The import hook on a dummy `tensorflow` package written to a temp dir at the front of `sys.path`
(fast: no real TensorFlow is imported in this process)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tfgpu_magic import importhooks
from tfgpu_magic.tf import quietimport

PACKAGES = ("tensorflow", "fakekeras", "tfgpu_events", "user_code")
FILES = {
    "tfgpu_events.py": "log = []\nfail_body = False\nspeak = False\n",
    "tensorflow/__init__.py": (
        "import os\n"
        "import tfgpu_events\n"
        "if tfgpu_events.speak:\n"
        "    os.write(2, b'I0000 00:00:1.5 7 port.cc:153] chatter\\nE0000 00:00:1.5 7 x.cc:1] boom\\nmine\\n')\n"
        "if tfgpu_events.fail_body:\n"
        "    raise ImportError('broken TensorFlow')\n"
        "tfgpu_events.log.append('tensorflow body')\n"
        "READY = True\n"
    ),
    "tensorflow/sub.py": "import tfgpu_events\ntfgpu_events.log.append('tensorflow.sub body')\n",
    "fakekeras/__init__.py": "import tensorflow\nimport tfgpu_events\ntfgpu_events.log.append('keras body')\n",
    "user_code.py": "import tensorflow\nimport tfgpu_events\ntfgpu_events.log.append('after import')\n",
}


def _forget() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in PACKAGES:
            del sys.modules[name]


@pytest.fixture
def events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The dummy packages on `sys.path`; the list each of them (and the callbacks) append to."""
    assert "tensorflow" not in sys.modules, "this process must not have TensorFlow"
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    import tfgpu_events

    yield tfgpu_events.log
    quietimport.disarm()
    _forget()


def recorder(log: list[str], name: str = "callback") -> Callable[[], None]:
    """A callback that logs itself, and that TensorFlow's package body has run when it is called."""

    def callback() -> None:
        log.append(name if getattr(sys.modules.get("tensorflow"), "READY", False) else f"{name} too early")

    return callback


def hooks() -> int:
    """Hooks in `sys.meta_path`, counted by class name (a reload makes a second class of that name)."""
    return sum(type(finder).__name__ == "ImportHook" and getattr(finder, "target", None) == "tensorflow"
               for finder in sys.meta_path)


def test_callback_runs_right_after_the_package_body(events: list[str]) -> None:
    """Before the importing code goes on: `import tensorflow` and the first op can share a cell."""
    quietimport.arm(recorder(events))
    import user_code  # noqa: F401

    assert events == ["tensorflow body", "callback", "after import"]


def test_submodule_import_runs_the_callback_before_the_submodule(events: list[str]) -> None:
    quietimport.arm(recorder(events))
    importlib.import_module("tensorflow.sub")
    assert events == ["tensorflow body", "callback", "tensorflow.sub body"]


def test_import_through_another_package(events: list[str]) -> None:
    """`import keras` pulls TensorFlow in: the callback runs there too, before keras goes on."""
    quietimport.arm(recorder(events))
    import fakekeras  # noqa: F401

    assert events == ["tensorflow body", "callback", "keras body"]


def test_hook_removes_itself_and_puts_the_loader_back(events: list[str]) -> None:
    quietimport.arm(recorder(events))
    import tensorflow

    assert not quietimport.is_armed() and hooks() == 0
    assert "exec_module" not in vars(tensorflow.__spec__.loader)
    importlib.reload(tensorflow)  # a later load of the package runs no callback
    assert events == ["tensorflow body", "callback", "tensorflow body"]


def test_find_spec_leaves_the_hook_armed(events: list[str]) -> None:
    """Asking whether TensorFlow exists is not importing it."""
    quietimport.arm(recorder(events))
    assert importlib.util.find_spec("tensorflow") is not None
    assert quietimport.is_armed() and events == []
    import tensorflow  # noqa: F401

    assert events == ["tensorflow body", "callback"]


def test_failing_callback_warns_and_the_import_works(events: list[str]) -> None:
    def fail() -> None:
        raise RuntimeError("boom")

    quietimport.arm(fail)
    with pytest.warns(UserWarning, match="could not apply the GPU policy on `import tensorflow`: boom"):
        import tensorflow
    assert tensorflow.READY and events == ["tensorflow body"]


def test_failed_import_keeps_the_hook_for_the_next_try(events: list[str]) -> None:
    import tfgpu_events

    quietimport.arm(recorder(events))
    tfgpu_events.fail_body = True
    with pytest.raises(ImportError, match="broken TensorFlow"):
        import tensorflow  # noqa: F401
    assert quietimport.is_armed() and events == []
    tfgpu_events.fail_body = False
    import tensorflow  # noqa: F401, F811

    assert events == ["tensorflow body", "callback"]


def test_arm_twice_keeps_one_hook(events: list[str]) -> None:
    quietimport.arm(recorder(events, "first"))
    quietimport.arm(recorder(events, "second"))
    assert hooks() == 1
    import tensorflow  # noqa: F401

    assert events == ["tensorflow body", "second"]


@pytest.fixture
def reloaded() -> Iterator[None]:
    """`importlib.reload(importhooks)` for the test; every hook is removed after it."""
    yield
    quietimport.disarm()
    assert hooks() == 0


def test_reload_then_arm_leaves_one_hook(events: list[str], reloaded: None) -> None:
    """A reload makes a new hook class; the hook of the old class must still be recognised, or two hooks
    wrap one loader and each finds the other (`RecursionError` on `import tensorflow`)."""
    quietimport.arm(recorder(events, "old"))
    importlib.reload(importhooks)
    quietimport.arm(recorder(events, "new"))
    assert hooks() == 1
    import tensorflow  # noqa: F401

    assert events == ["tensorflow body", "new"] and hooks() == 0


def test_hook_from_before_a_reload_still_works_and_disarms(events: list[str], reloaded: None) -> None:
    quietimport.arm(recorder(events, "old"))
    importlib.reload(importhooks)
    assert quietimport.is_armed()
    import tensorflow  # noqa: F401

    assert events == ["tensorflow body", "old"] and hooks() == 0
    quietimport.arm(recorder(events, "again"))
    importlib.reload(importhooks)
    quietimport.disarm()
    assert hooks() == 0


@pytest.fixture
def quiet_error(events: list[str]) -> Iterator[list[str]]:
    """The dummy TensorFlow writes an info, an error and a plain line to fd 2; the hook is quiet."""
    import tfgpu_events

    tfgpu_events.speak = True
    quietimport.quiet("error")
    yield events
    quietimport.quiet(None)


def test_quiet_import_drops_the_lines_below_the_level(quiet_error: list[str], capfd: pytest.CaptureFixture) -> None:
    quietimport.arm(recorder(quiet_error))
    import tensorflow  # noqa: F401

    assert capfd.readouterr().err == "E0000 00:00:1.5 7 x.cc:1] boom\nmine\n"
    assert quiet_error == ["tensorflow body", "callback"]


def test_failed_quiet_import_filters_the_same_and_rearms(quiet_error: list[str], capfd: pytest.CaptureFixture) -> None:
    """Lines are filtered as they are written, whatever way the import ends; the hook waits for the next try."""
    import tfgpu_events

    tfgpu_events.fail_body = True
    quietimport.arm(recorder(quiet_error))
    with pytest.raises(ImportError):
        import tensorflow  # noqa: F401
    assert capfd.readouterr().err == "E0000 00:00:1.5 7 x.cc:1] boom\nmine\n" and quietimport.is_armed()
