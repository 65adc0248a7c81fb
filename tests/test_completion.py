"""Tab completion of `%tfgpu` lines, `%%tfgpu` cells and `tfgpu_magic.` attributes on a real IPython
shell (`shell.Completer.completions`, what ipykernel and terminal IPython call)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from IPython.core.completer import provisionalcompleter

import tfgpu_magic
from fake_nvml import FakeNvml, four_gpus
from tfgpu_magic.views.magics import COMPLETER_ID, register_completer
from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.envvars import NAMES as OUR_ENV


def complete(shell, text: str) -> list[str]:
    """What Tab offers with the cursor at the end of `text`."""
    with provisionalcompleter():
        return sorted({c.text for c in shell.Completer.completions(text, len(text))})


@pytest.mark.parametrize(
    "text, offered",
    [
        ("%tfgpu gr", ["growth"]),
        ("%tfgpu al", ["allocator"]),
        ("%tfgpu GR", ["growth"]),
        ("%tfgpu growth ", ["all", "off", "on"]),
        ("%tfgpu growth o", ["off", "on"]),
        ("%tfgpu allocator ", ["async", "bfc"]),
        ("%tfgpu export ", ["env", "json", "python"]),
        ("%tfgpu default s", ["save", "show"]),
        ("%tfgpu autoload ", ["off", "on"]),
        ("%tfgpu limit o", ["off"]),
        ("%tfgpu visible ", ["all", "auto", "none"]),
        ("%tfgpu split ", ["cpu", "off"]),
        ("%tfgpu restart --", ["--yes"]),
        ("%tfgpu kernelspec mine --", ["--display-name", "--remove", "--slurm"]),
        ("%%tfgpu\ngrowth on\nli", ["limit"]),
        ("%%tfgpu\nallocator a", ["async"]),
    ],
)
def test_completes_directives_and_closed_argument_sets(shell, text: str, offered: list[str]) -> None:
    assert complete(shell, text) == offered


def test_all_directives_on_an_empty_line_and_only_edits_in_a_cell(shell) -> None:
    from tfgpu_magic.language.directives import CELL_NAMES, NAMES

    assert complete(shell, "%tfgpu ") == sorted(NAMES)
    assert complete(shell, "%%tfgpu\n") == sorted(CELL_NAMES)


@pytest.mark.parametrize("text", ["x = gr", "%%tfgpu\n# gr", "print('%tfgpu gr')"])
def test_offers_nothing_of_ours_elsewhere(shell, text: str) -> None:
    assert "growth" not in complete(shell, text)


def test_gpu_indices_come_from_the_inventory(shell, monkeypatch) -> None:
    """With an NVML inventory (fake NVML, four GPUs), GPU arguments complete to its indices."""
    catalog = InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus()))))
    controller = Controller(environ={}, catalog=catalog)
    register_completer(shell, lambda: controller)
    try:
        assert complete(shell, "%tfgpu visible ") == ["0", "1", "2", "3", "all", "auto", "none"]
        assert complete(shell, "%tfgpu limit 1GB ") == ["0", "1", "2", "3"]
        assert complete(shell, "%tfgpu split off ") == ["0", "1", "2", "3", "cpu"]
    finally:
        register_completer(shell, tfgpu_magic.get_controller)


def test_registering_again_replaces_the_matcher(shell) -> None:
    register_completer(shell, tfgpu_magic.get_controller)
    register_completer(shell, tfgpu_magic.get_controller)
    ours = [m for m in shell.Completer.custom_matchers if getattr(m, "matcher_identifier", "") == COMPLETER_ID]
    assert len(ours) == 1


def test_without_inventory_no_indices_and_no_error(shell) -> None:
    controller = Controller(environ={}, catalog=InventoryCatalog(Inventory(error="no NVML here")))
    register_completer(shell, lambda: controller)
    try:
        assert complete(shell, "%tfgpu visible ") == ["all", "auto", "none"]
    finally:
        register_completer(shell, tfgpu_magic.get_controller)


def test_lazy_attributes_are_in_dir(shell) -> None:
    """`tfgpu_magic.conf<Tab>` offers `configure`, which loads on first use (PEP 562)."""
    assert {"configure", "Policy"} <= set(dir(tfgpu_magic))
    shell.run_cell("import tfgpu_magic")
    assert complete(shell, "tfgpu_magic.conf") == ["configure"]


TAB_PROBE = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.completer import provisionalcompleter
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "tfgpu_magic")
with provisionalcompleter():
    found = [c.text for c in shell.Completer.completions("%tfgpu visible ", 15)]
print(json.dumps({"found": sorted(found), "heavy": [m for m in ("tensorflow", "pynvml") if m in sys.modules]}))
"""


@pytest.mark.skipif(any(os.path.exists(p) for p in ("/proc/driver/nvidia", "/dev/nvidiactl")), reason="needs no driver")
def test_completing_gpus_without_a_driver_imports_nothing_heavy(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in OUR_ENV}
    env["IPYTHONDIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", TAB_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"found": ["all", "auto", "none"], "heavy": []}
