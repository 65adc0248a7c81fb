"""The profile startup files this project writes never leak, and pending files of gone kernels go.

The IPython profile is shared by every Python environment of a user. A second, real environment
(a fresh venv with IPython from the package index, without tfgpu_magic) runs `ipython -c` on the
same profile after `%tfgpu restart` and `%tfgpu autoload on` left their files: it must print only
what it was asked to. Kernels here are real (jupyter_client, isolated dirs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Iterator

import pytest
from servers import JupyterEnv, KernelConnection, isolated_jupyter, standalone_kernel

from tfgpu_magic.jupyter import persist
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.language.policy import Policy

pytestmark = [pytest.mark.kernel]

OLD_AUTOLOAD_CODE = f'{persist.AUTOLOAD_MARKER}\nget_ipython().run_line_magic("load_ext", "tfgpu_magic")\n'
OLD_PENDING_CODE = f"""{persist.PENDING_STARTUP_MARKER}
try:
    from tfgpu_magic.jupyter.startup import load_if_pending
    load_if_pending(get_ipython())
except Exception as err:  # a kernel must start whatever happens here
    print(f"tfgpu_magic: could not apply the pending policy: {{err}}")
"""
"""What earlier versions of this project wrote (same marker lines)."""
PIP_TIMEOUT = 300


@pytest.fixture(scope="session")
def other_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `bin` dir of a second real Python environment: a new venv with IPython installed by pip,
    and no tfgpu_magic (about 10 s). Skipped, saying why, where pip cannot reach a package index."""
    root = tmp_path_factory.mktemp("other-python")
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    bin_dir = root / "bin"
    try:
        installed = subprocess.run(
            [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "ipython"],
            capture_output=True, text=True, timeout=PIP_TIMEOUT, env={**os.environ, "PIP_NO_INPUT": "1"},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip could not install ipython into a second environment within {PIP_TIMEOUT} s")
    if installed.returncode != 0:
        pytest.skip(f"pip could not install ipython into a second environment: {installed.stderr.strip()[-300:]}")
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('tfgpu_magic') is not None)"
    found = subprocess.run([str(bin_dir / "python"), "-c", probe], cwd=root, env=_without_pythonpath(os.environ), timeout=60)
    assert found.returncode == 0, "the second environment can import tfgpu_magic"
    return bin_dir


def run_ipython(bin_dir: Path, env: JupyterEnv, code: str = "print(1)") -> subprocess.CompletedProcess[str]:
    """`ipython -c code` of the environment `bin_dir` on `env`'s profile and runtime dir."""
    return subprocess.run(
        [str(bin_dir / "ipython"), "--no-banner", "-c", code], env=_without_pythonpath(env.environ), cwd=env.root,
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _without_pythonpath(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """`environ` minus PYTHONPATH, which could hand this checkout to the other environment."""
    return {name: value for name, value in environ.items() if name != "PYTHONPATH"}


@pytest.fixture(scope="module")
def leftovers() -> Iterator[tuple[JupyterEnv, KernelConnection]]:
    """An env whose profile got both startup files from real `%tfgpu` commands, with a policy still
    pending (the kernel, on a temp-named connection file, was told to restart but was not)."""
    with isolated_jupyter("tfgpu-startup-") as env, standalone_kernel(env, naming="temp") as kernel:
        result = kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu restart --yes\n%tfgpu autoload on")
        assert "Not restarted" in result.stdout, result.output
        startup = env.profile_dir / "startup"
        assert {persist.PENDING_STARTUP_NAME, persist.AUTOLOAD_NAME} <= {p.name for p in startup.iterdir()}
        assert list(env.runtime_dir.glob(f"{persist.PENDING_PREFIX}*.json"))
        yield env, kernel


def test_other_environment_without_tfgpu_magic_stays_silent(other_python: Path, leftovers):
    """The second environment's `ipython -c 'print(1)'` on the shared profile prints exactly `1`,
    nothing on stderr, although both startup files are there and a policy is pending."""
    env, _ = leftovers
    ran = run_ipython(other_python, env)
    assert (ran.stdout, ran.stderr) == ("1\n", ""), (ran.stdout, ran.stderr)


def test_this_environments_terminal_ipython_stays_silent(leftovers):
    """Terminal IPython of this environment (which has tfgpu_magic): also exactly `1`; autoload
    loaded the extension quietly, the pending policy of the kernel was left for the kernel."""
    env, _ = leftovers
    bin_dir = Path(sys.executable).parent
    ran = run_ipython(bin_dir, env, "print(1); print('tfgpu_magic' in get_ipython().extension_manager.loaded)")
    assert (ran.stdout, ran.stderr) == ("1\nTrue\n", ""), (ran.stdout, ran.stderr)
    assert list(env.runtime_dir.glob(f"{persist.PENDING_PREFIX}*.json"))


def test_kernel_with_nothing_pending_imports_nothing(tmp_path: Path):
    """With the pending startup file in the profile but nothing pending, a new kernel has not
    imported tfgpu_magic at all (one directory listing was the whole cost)."""
    with isolated_jupyter("tfgpu-quiet-") as env:
        persist.set_pending_startup(env.profile_dir)
        with standalone_kernel(env, naming="temp") as kernel:
            result = kernel.ok("import sys\nprint(sorted(m for m in sys.modules if m.startswith('tfgpu_magic')))")
            assert result.stdout.strip() == "[]" and not result.stderr, result.output
            assert kernel.evaluate("[n for n in dir() if 'tfgpu' in n]") == []


def test_old_startup_files_are_upgraded_in_place(tmp_path: Path):
    """Startup files an older version wrote (same marker line) are rewritten with the current code;
    a stranger's file of the same name is left alone."""
    startup = tmp_path / "startup"
    startup.mkdir()
    (startup / persist.PENDING_STARTUP_NAME).write_text(OLD_PENDING_CODE)
    (startup / persist.AUTOLOAD_NAME).write_text("# my own autoload\n")
    persist.upgrade_startup_files(tmp_path)
    assert (startup / persist.PENDING_STARTUP_NAME).read_text() == persist.PENDING_STARTUP_CODE
    assert (startup / persist.AUTOLOAD_NAME).read_text() == "# my own autoload\n"
    (startup / persist.AUTOLOAD_NAME).write_text(OLD_AUTOLOAD_CODE)
    persist.set_pending_startup(tmp_path)
    persist.upgrade_startup_files(tmp_path)
    assert (startup / persist.AUTOLOAD_NAME).read_text() == persist.AUTOLOAD_CODE


def test_loading_the_extension_upgrades_old_startup_files(other_python: Path):
    """A kernel of this environment that loads the extension rewrites the old files; after that the
    other environment is silent on the same profile."""
    with isolated_jupyter("tfgpu-upgrade-") as env:
        startup = env.profile_dir / "startup"
        startup.mkdir(parents=True, exist_ok=True)
        (startup / persist.PENDING_STARTUP_NAME).write_text(OLD_PENDING_CODE)
        (startup / persist.AUTOLOAD_NAME).write_text(OLD_AUTOLOAD_CODE)
        leaked = run_ipython(other_python, env)
        assert leaked.stdout != "1\n" or leaked.stderr, "the old files were expected to leak"
        with standalone_kernel(env, naming="temp") as kernel:
            assert kernel.evaluate("'tfgpu_magic' in get_ipython().extension_manager.loaded")
        assert (startup / persist.PENDING_STARTUP_NAME).read_text() == persist.PENDING_STARTUP_CODE
        assert (startup / persist.AUTOLOAD_NAME).read_text() == persist.AUTOLOAD_CODE
        ran = run_ipython(other_python, env)
        assert (ran.stdout, ran.stderr) == ("1\n", "")


def test_autoload_refuses_a_strangers_file(tmp_path: Path):
    """`autoload on/off` never overwrites or removes a startup file of that name it did not write."""
    path = persist.autoload_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("print('mine')\n")
    for enable in (True, False):
        with pytest.raises(PolicyError, match="not written by tfgpu_magic"):
            persist.set_autoload(tmp_path, enable)
    assert path.read_text() == "print('mine')\n"


# ----- pending files of kernels that are gone -------------------------------------------------------
def test_pending_file_of_a_gone_kernel_is_removed(tmp_path: Path):
    """A pending file whose kernel's connection file is gone is removed by the next store or take; one
    whose connection file exists stays; files that are not provably ours stay, whatever their age."""
    alive = tmp_path / "kernel-alive.json"
    alive.write_text("{}")
    gone = persist.store_pending("gone", Policy(cpu_devices=2), connection_file=tmp_path / "tmpgone.json", directory=tmp_path)
    kept = persist.store_pending("alive", Policy(cpu_devices=2), connection_file=alive, directory=tmp_path)
    record = json.loads(kept.read_text())
    strangers = {
        "not-ours": {"format": "someone/1", "connection_file": "/nonexistent", "created": 0},
        "other-key": {**record, "kernel_id": "someone-else", "connection_file": "/nonexistent", "created": 0},
        "corrupt": None,
    }
    for name, content in strangers.items():
        path = tmp_path / f"{persist.PENDING_PREFIX}{name}.json"
        path.write_text("{garbage" if content is None else json.dumps(content))
        path.chmod(0o600)
    unrelated = tmp_path / "notes.json"
    unrelated.write_text("{}")
    assert persist.take_pending("nothing-here", directory=tmp_path) is None
    assert not gone.exists() and kept.exists() and unrelated.exists()
    assert all((tmp_path / f"{persist.PENDING_PREFIX}{name}.json").exists() for name in strangers)


def test_pending_file_of_a_kernel_that_was_shut_down_is_cleaned_by_the_next_restart():
    """Real kernels: A stores a pending policy and is shut down (its connection file goes); B's
    `%tfgpu restart --yes` removes A's file and keeps its own."""
    with isolated_jupyter("tfgpu-clean-") as env:
        with standalone_kernel(env, naming="temp") as first:
            first.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu restart --yes")
            (left,) = env.runtime_dir.glob(f"{persist.PENDING_PREFIX}*.json")
        assert left.exists()
        with standalone_kernel(env, naming="vscode") as second:
            second.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 3\n%tfgpu restart --yes")
            (own,) = env.runtime_dir.glob(f"{persist.PENDING_PREFIX}*.json")
        assert own != left and not left.exists()
