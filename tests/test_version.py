"""One version, written once: labextension/package.json's. The build hands it to the Python package's
metadata (hatch-nodejs-version, pyproject.toml's `[tool.hatch.version]`) and writes it into
tfgpu_magic/_version.py, which `tfgpu_magic.__version__` imports without asking importlib.metadata
(slower: that would weigh on `%load_ext`)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_json_version() -> str:
    return json.loads((ROOT / "labextension" / "package.json").read_text())["version"]


def test_the_package_json_version_is_the_python_version() -> None:
    import tfgpu_magic

    version = package_json_version()
    assert tfgpu_magic.__version__ == version
    assert importlib.metadata.version("tfgpu_magic") == version


def test_the_version_comes_from_the_built_file_not_from_metadata() -> None:
    """`import tfgpu_magic` reads `_version.py` and leaves importlib.metadata unimported."""
    code = ("import sys, tfgpu_magic; "
            "print(tfgpu_magic.__version__, 'tfgpu_magic._version' in sys.modules, 'importlib.metadata' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [package_json_version(), "True", "False"], done.stdout
