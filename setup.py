"""The package's metadata is in setup.cfg; this file adds what a static file cannot say: the JupyterLab
extension, built from `labextension/` (TypeScript) into `tfgpu_magic/labextension/` when the sdist or
the wheel is built, and shipped as data under `share/jupyter/labextensions/tfgpu-magic` (where JupyterLab
finds prebuilt extensions: users need no Node.js), with the file that enables the server extension under
`etc/jupyter/jupyter_server_config.d/`. The same layout as jupyter-resource-usage and
jupyterlab-nvdashboard, built here by setuptools instead of hatch-jupyter-builder.

Building needs Node.js 20.19+ or 22.12+ (what the builder, rspack, runs on) and npm, unless
`tfgpu_magic/labextension/` is already built and newer than its sources (an sdist carries it built, so
building its wheel needs no Node.js).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
SOURCE = ROOT / "labextension"
BUILT = ROOT / "tfgpu_magic" / "labextension"
NAME = "tfgpu-magic"
"""The npm package's name: its folder under share/jupyter/labextensions."""
SOURCES = ("package.json", "package-lock.json", "tsconfig.json", "src", "style", "schema")


def newest(root: Path, names: tuple[str, ...]) -> float:
    """The latest modification time of the files `names` hold under `root` (0 when there are none)."""
    times = [0.0]
    for name in names:
        path = root / name
        files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else []
        times += [f.stat().st_mtime for f in files]
    return max(times)


def build_labextension() -> None:
    """`npm ci` (when node_modules is missing or older than the lock file), then `npm run build`, unless
    the build is newer than every source. Output goes to stderr: `setup.py --name` must print the name only."""
    if not (SOURCE / "package.json").is_file():
        return
    marker = BUILT / "package.json"
    if marker.is_file() and marker.stat().st_mtime >= newest(SOURCE, SOURCES):
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("tfgpu_magic: building the JupyterLab extension (labextension/) needs Node.js 20.19+ or 22.12+ and npm "
                 "(https://nodejs.org); install them, or install tfgpu_magic from its wheel or sdist, which carry it built")
    installed = SOURCE / "node_modules" / ".package-lock.json"
    if not installed.is_file() or installed.stat().st_mtime < (SOURCE / "package-lock.json").stat().st_mtime:
        subprocess.run([npm, "ci", "--prefer-offline", "--no-audit", "--no-fund"], cwd=SOURCE, check=True, stdout=sys.stderr)
    subprocess.run([npm, "run", "build"], cwd=SOURCE, check=True, stdout=sys.stderr)


def data_files() -> list[tuple[str, list[str]]]:
    """The built labextension and its install.json under share/jupyter/labextensions/tfgpu-magic, and the
    server extension's enabling file (paths relative to this folder, as setuptools wants them)."""
    target = f"share/jupyter/labextensions/{NAME}"
    found: dict[str, list[str]] = {target: ["labextension/install.json"]} if (SOURCE / "install.json").is_file() else {}
    for path in sorted(BUILT.rglob("*")) if BUILT.is_dir() else []:
        if path.is_file():
            folder = path.parent.relative_to(BUILT).as_posix()
            found.setdefault(target if folder == "." else f"{target}/{folder}", []).append(path.relative_to(ROOT).as_posix())
    found["etc/jupyter/jupyter_server_config.d"] = ["jupyter-config/jupyter_server_config.d/tfgpu_magic.json"]
    return sorted(found.items())


build_labextension()
setup(data_files=data_files())
