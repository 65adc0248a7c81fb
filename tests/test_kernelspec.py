"""`%tfgpu kernelspec` never replaces or removes a folder it did not make.

Real parts only: the real magic on the test IPython shell and jupyter_client's own `KernelSpecManager`
over isolated JUPYTER_DATA_DIR / JUPYTER_CONFIG_DIR / JUPYTER_PATH / IPYTHONDIR.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest
from IPython.core.error import UsageError
from jupyter_client.kernelspec import KernelSpecManager

from servers import JupyterEnv, isolated_jupyter
from tfgpu_magic.jupyter.kernelspec import MARKER

NAME = "notes"
OURS = {"argv": ["python"], "display_name": "ours", "language": "python", "metadata": {MARKER: {"policy": {}}}}
"""A kernel.json as this project writes it (the marker is what makes a folder ours)."""
Runner = Callable[[str], str]
"""`%tfgpu kernelspec ARGS` on the shell; what it printed."""


# ----- fixtures ---------------------------------------------------------------------------------
@pytest.fixture
def jupyter(monkeypatch: pytest.MonkeyPatch) -> Iterator[JupyterEnv]:
    """This process's Jupyter and IPython dirs in a temp root, plus a JUPYTER_PATH dir (`root/path`)
    that Jupyter searches before the user's own kernelspecs."""
    with isolated_jupyter("tfgpu-kernelspec-") as env:
        for name in ("JUPYTER_PREFER_ENV_PATH", "JUPYTER_PLATFORM_DIRS"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.environ.items():
            if name.startswith("JUPYTER_") or name == "IPYTHONDIR":
                monkeypatch.setenv(name, value)
        monkeypatch.setenv("JUPYTER_PATH", str(env.root / "path"))
        yield env


@pytest.fixture
def kernelspec(shell, capsys) -> Runner:
    """Run `%tfgpu kernelspec ARGS`; what it printed."""

    def run(args: str) -> str:
        capsys.readouterr()
        shell.run_line_magic("tfgpu", f"kernelspec {args}")
        return capsys.readouterr().out

    return run


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under `root` and what it is (a file's bytes, a link's target, a folder, another type);
    links are not followed and nothing but regular files is opened."""
    found: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[str(path.relative_to(root))] = ("link", os.readlink(path))
            elif stat.S_ISREG(mode):
                found[str(path.relative_to(root))] = ("file", path.read_bytes())
            else:
                found[str(path.relative_to(root))] = ("type", stat.S_IFMT(mode))
    return found


def refused(kernelspec: Runner, args: str) -> str:
    """The one-line `UsageError` that `%tfgpu kernelspec ARGS` must raise."""
    with pytest.raises(UsageError) as caught:
        kernelspec(args)
    message = str(caught.value)
    assert message and "\n" not in message, message
    assert "Traceback" not in message
    return message


# ----- folders of the same name that this project did not make ---------------------------------
def _json(value: object) -> Callable[[Path], None]:
    return _bytes(json.dumps(value).encode())


def _bytes(data: bytes) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "kernel.json").write_bytes(data)

    return make


def _no_kernel_json(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "important.txt").write_text("the only copy\n", encoding="utf-8")


def _fifo(folder: Path) -> None:
    folder.mkdir(parents=True)
    os.mkfifo(folder / "kernel.json")


def _dev_zero(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "kernel.json").symlink_to("/dev/zero")


def _ours_plus_a_file(folder: Path) -> None:
    _json(OURS)(folder)
    (folder / "notes.txt").write_text("written by the user\n", encoding="utf-8")


def _link_to_ours_elsewhere(folder: Path) -> None:
    elsewhere = folder.parent.parent.parent / "elsewhere"
    _json(OURS)(elsewhere)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(elsewhere, target_is_directory=True)


def _plain_file(folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_text("not a folder\n", encoding="utf-8")


DEPTH = 100_000
NOT_OURS: dict[str, Callable[[Path], None]] = {
    "no kernel.json": _no_kernel_json,
    "invalid JSON": _bytes(b'{"argv": ['),
    "a list": _json([OURS]),
    "metadata null": _json({**OURS, "metadata": None}),
    "metadata a list": _json({**OURS, "metadata": [MARKER]}),
    "marker not an object": _json({**OURS, "metadata": {MARKER: "yes"}}),
    "another project's kernelspec": _json({**OURS, "metadata": {"debugger": True}}),
    "huge": _json({**OURS, "padding": "x" * (2 << 20)}),
    "deeply nested": _bytes(b'{"metadata": {"tfgpu_magic": ' + b"[" * DEPTH + b"]" * DEPTH + b"}}"),
    "not UTF-8": _bytes(b'{"display_name": "\xff"}'),
    "FIFO": _fifo,
    "link to /dev/zero": _dev_zero,
    "ours plus a file we did not write": _ours_plus_a_file,
    "folder is a link": _link_to_ours_elsewhere,
    "a file, not a folder": _plain_file,
}


def _user_folder(env: JupyterEnv) -> Path:
    return env.kernels_dir / NAME


def _in_jupyter_path(env: JupyterEnv) -> Path:
    return env.root / "path" / "kernels" / NAME


def _in_ipython_dir(env: JupyterEnv) -> Path:
    return env.ipython_dir / "kernels" / NAME


def _other_case(env: JupyterEnv) -> Path:
    return env.kernels_dir / NAME.upper()


NAMESAKES: dict[str, Callable[[JupyterEnv], Path]] = {
    "JUPYTER_PATH": _in_jupyter_path,
    "IPython dir": _in_ipython_dir,
    "user dir, other case": _other_case,
}
"""Other folders where Jupyter finds a kernelspec NAME: it would hide ours, or ours would hide it."""
CASES: dict[str, tuple[Callable[[JupyterEnv], Path], Callable[[Path], None]]] = {
    **{case: (_user_folder, make) for case, make in NOT_OURS.items()},
    **{f"namesake in {where}": (place, _json({**OURS, "metadata": {}})) for where, place in NAMESAKES.items()},
}


@pytest.mark.parametrize("remove", [False, True], ids=["install", "remove"])
@pytest.mark.parametrize("case", CASES)
def test_folder_not_made_here_is_left_alone(jupyter: JupyterEnv, kernelspec: Runner, case: str, remove: bool) -> None:
    """`kernelspec NAME` (and `--remove`) where a folder this project did not make is, or where Jupyter
    finds a namesake: one UsageError naming that folder, and every file under the Jupyter dirs still
    there, byte for byte (nothing written, nothing removed)."""
    place, make = CASES[case]
    folder = place(jupyter)
    make(folder)
    before = snapshot(jupyter.root)
    message = refused(kernelspec, NAME + (" --remove" if remove else ""))
    assert repr(NAME) in message and str(folder) in message
    assert snapshot(jupyter.root) == before


def test_standard_python3_name_is_refused(jupyter: JupyterEnv, kernelspec: Runner) -> None:
    """`python3` is the kernelspec every front end starts by default: never ours to take over."""
    (jupyter.kernels_dir / "python3").rename(jupyter.root / "python3-moved")
    before = snapshot(jupyter.root)
    assert "python3" in refused(kernelspec, "python3")
    assert snapshot(jupyter.root) == before


def test_install_replace_and_remove_our_own(jupyter: JupyterEnv, kernelspec: Runner) -> None:
    """Ours is installed where jupyter_client looks (JUPYTER_DATA_DIR/kernels/NAME), replaced in place,
    and removed; the bystander `python3` kernelspec is untouched throughout."""
    bystander = snapshot(jupyter.kernels_dir / "python3")
    folder = jupyter.kernels_dir / NAME
    assert str(folder) in kernelspec(NAME)
    assert sorted(os.listdir(folder)) == ["kernel.json"]
    spec = KernelSpecManager().get_kernel_spec(NAME)
    assert Path(spec.resource_dir) == folder and MARKER in spec.metadata

    kernelspec(f'{NAME} --display-name "Second"')
    assert sorted(os.listdir(folder)) == ["kernel.json"], "a temporary file was left behind"
    assert KernelSpecManager().get_kernel_spec(NAME).display_name == "Second"

    assert str(folder) in kernelspec(f"{NAME} --remove")
    assert not os.path.lexists(folder)
    assert "not installed" in refused(kernelspec, f"{NAME} --remove")
    assert snapshot(jupyter.kernels_dir / "python3") == bystander


def test_replacing_ours_is_atomic(jupyter: JupyterEnv, kernelspec: Runner) -> None:
    """While ours is replaced again and again, a reader (a front end listing kernels) always finds a
    whole kernel.json, never a missing folder or half a file."""
    path = jupyter.kernels_dir / NAME / "kernel.json"
    kernelspec(NAME)
    seen: list[str] = []
    problems: list[str] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                seen.append(json.loads(path.read_bytes())["display_name"])
            except (OSError, ValueError) as err:
                problems.append(repr(err))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for round_ in range(40):
            kernelspec(f"{NAME} --display-name v{round_}")
    finally:
        done.set()
        reader.join(timeout=10)
    assert problems == [] and seen, problems[:3]
    assert json.loads(path.read_bytes())["display_name"] == "v39"
