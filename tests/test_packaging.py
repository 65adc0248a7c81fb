"""The package as users get it: the wheel and sdist that `python -m build` makes from this source pass
`twine check` and carry the LICENSE, and the wheel built from the sdist needs no Node.js; installed into a
fresh virtual environment as the README says (the wheel, or `pip install -e .` in a clone), `%load_ext
tfgpu_magic` and `ipython_config.py`'s `c.InteractiveShellApp.extensions` work without TensorFlow, and the
install alone enables the server extension and the JupyterLab extension: nobody writes a Jupyter config.

The build and the installs fetch hatchling, hatch-jupyter-builder, IPython, traitlets, ipywidgets and
JupyterLab from the package index (pip's cache is fine); they skip, with pip's message, when pip cannot
download from it, and never for a failure with the index in reach. Building the JupyterLab extension in a
clone needs node and npm (npm's cache is fine). The oldest Python that python_requires admits is tried where
this machine has it (on PATH or pyenv's); else those cases skip, saying so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from kernels import isolated_env, quiet_env
from kernels import HEAVY_MODULES
from servers import isolated_jupyter, running_server

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

from tfgpu_magic.views.status import RECORDED

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT = 240
INSTALL_TIMEOUT = 300
RUN_TIMEOUT = 60
JUPYTER = "jupyterlab"
"""What the Jupyter checks install beside tfgpu_magic: JupyterLab (with jupyter_server), as a user has it."""
CONFIG_LINE = 'c.InteractiveShellApp.extensions = ["tfgpu_magic"]'
"""The README's way to load the extension in every kernel of a profile."""
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
HAS_MAGIC = "print('tfgpu' in get_ipython().magics_manager.magics['line'])"


@dataclass(frozen=True)
class Dists:
    """What one `python -m build` made, and the source it made it from."""

    source: Path
    files: frozenset[str]
    """The source's files, relative to it, as copied (before anything ran in it)."""
    wheel: Path
    """Built from the sdist, with no node or npm on PATH."""
    sdist: Path


def run(
    argv: list[str | Path], *, timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`argv` with its output captured; a timeout kills the child (subprocess.run does)."""
    argv = [str(arg) for arg in argv]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def index_unreachable(python: Path | str, where: Path, requirement: str) -> str | None:
    """Why pip cannot download `requirement` from the package index, or None when it can: the one
    reason these tests may skip (a failure with a reachable index is a failure)."""
    probe = run([python, "-m", "pip", "download", "--no-deps", "--quiet", "-d", where / "probe", requirement],
                timeout=INSTALL_TIMEOUT)
    if probe.returncode == 0:
        return None
    last = [line for line in (probe.stderr + probe.stdout).splitlines() if line.strip()]
    return f"pip cannot download {requirement!r} from the package index: {last[-1] if last else probe.returncode}"


def check(
    result: subprocess.CompletedProcess[str], python: Path | str, where: Path, requirement: str, what: str
) -> None:
    """Fail on a failed step, unless the package index is out of reach (then skip, saying so)."""
    if result.returncode == 0:
        return
    reason = index_unreachable(python, where, requirement)
    if reason:
        pytest.skip(reason)
    pytest.fail(f"{what} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def pyproject() -> dict[str, Any]:
    """pyproject.toml: the package's metadata ([project]) and its build."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)


def build_requirement() -> str:
    """The build backend that pyproject.toml's [build-system] asks for (what isolation downloads)."""
    return pyproject()["build-system"]["requires"][0]


def without_node() -> dict[str, str]:
    """This environment with no folder on PATH that holds node or npm."""
    folders = os.environ.get("PATH", "").split(os.pathsep)
    kept = [folder for folder in folders if not any((Path(folder) / name).exists() for name in ("node", "npm"))]
    env = {**os.environ, "PATH": os.pathsep.join(kept)}
    assert shutil.which("npm", path=env["PATH"]) is None and shutil.which("node", path=env["PATH"]) is None
    return env


def copy_source(dest: Path) -> frozenset[str]:
    """Copy the files git knows (tracked, or new and not ignored) to `dest`, and name them: the build
    sees this source and nothing else, and writes no build/ or dist/ into the checkout."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, timeout=RUN_TIMEOUT)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, so the source to package is unknown: {listed.stderr.strip()}")
    # A file listed but deleted in the working tree is not part of the source.
    files = frozenset(name for name in listed.stdout.split("\0") if name and (ROOT / name).is_file())
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    return files


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """The sdist, and the wheel built from it, as `python -m build` makes them for a release (it builds the
    sdist, then the wheel from the sdist unpacked): here the wheel's build sees no node or npm."""
    tmp = tmp_path_factory.mktemp("packaging")
    source = tmp / "source"
    files = copy_source(source)
    out = tmp / "dist"
    built = run([sys.executable, "-m", "build", "--sdist", "--outdir", out, source], timeout=BUILD_TIMEOUT)
    check(built, sys.executable, tmp, build_requirement(), "python -m build --sdist")
    (sdist,) = out.glob("tfgpu_magic-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp / "unpacked", filter="data")
    (unpacked,) = (tmp / "unpacked").iterdir()
    built = run([sys.executable, "-m", "build", "--wheel", "--outdir", out, unpacked], timeout=BUILD_TIMEOUT,
                env=without_node())
    check(built, sys.executable, tmp, build_requirement(), "python -m build --wheel, from the sdist, without node")
    (wheel,) = out.glob("tfgpu_magic-*-py3-none-any.whl")
    return Dists(source=source, files=files, wheel=wheel, sdist=sdist)


def test_twine_check_passes(dists: Dists) -> None:
    result = run([sys.executable, "-m", "twine", "check", "--strict", dists.wheel, dists.sdist], timeout=RUN_TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_wheel_has_license_metadata_and_every_module(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        names = set(wheel.namelist())
        (info,) = {name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")}
        licenses = [name for name in (f"{info}/licenses/LICENSE", f"{info}/LICENSE") if name in names]
        assert licenses, f"no LICENSE in {sorted(names)}"
        assert wheel.read(licenses[0]) == (dists.source / "LICENSE").read_bytes()
        meta = wheel.read(f"{info}/METADATA").decode()
    modules = {name for name in dists.files if name.startswith("tfgpu_magic/") and name.endswith(".py")}
    assert modules <= names, f"missing from the wheel: {sorted(modules - names)}"
    assert not [name for name in names if name.startswith("tests/")], "the tests are not part of the wheel"
    data = f"{info.removesuffix('.dist-info')}.data/data/"  # the prebuilt labextension and the server extension's switch
    assert f"{data}share/jupyter/labextensions/tfgpu-magic/package.json" in names
    assert f"{data}etc/jupyter/jupyter_server_config.d/tfgpu_magic.json" in names
    fields = meta.split("\n\n", 1)[0].splitlines()
    assert "License-Expression: BSD-3-Clause" in fields
    assert "License-File: LICENSE" in fields
    requires = pyproject()["project"]["requires-python"]
    assert f"Requires-Python: {requires}" in fields
    classifiers = {line.removeprefix("Classifier: ") for line in fields if line.startswith("Classifier: ")}
    tested = f"Programming Language :: Python :: {sys.version_info.major}.{sys.version_info.minor}"
    assert tested in classifiers, f"pyproject.toml's classifiers should name {tested}: the suite runs on it"
    assert not [c for c in classifiers if c.startswith("License ::")], "PEP 639: the expression, not a classifier"


def test_sdist_is_the_whole_source(dists: Dists) -> None:
    """A packager can build and test from the sdist alone: LICENSE, the package, the tests and their
    support modules, the notebooks the tests execute."""
    with tarfile.open(dists.sdist) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        names = {name.removeprefix(f"{top}/") for name in sdist.getnames()}
        assert "LICENSE" in names, sorted(names)
        license_member = sdist.extractfile(f"{top}/LICENSE")
        assert license_member is not None and license_member.read() == (dists.source / "LICENSE").read_bytes()
    needed = {name for name in dists.files if name.split("/")[0] in ("tfgpu_magic", "tests", "notebooks")}
    assert needed <= names, f"missing from the sdist: {sorted(needed - names)}"


def oldest_python() -> str | None:
    """An interpreter for the oldest Python that python_requires admits (on PATH, or pyenv's), if here."""
    oldest = pyproject()["project"]["requires-python"].removeprefix(">=")
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{oldest}"), *sorted(pyenv.glob(f"versions/{oldest}.*/bin/python{oldest}"))]
    for candidate in filter(None, candidates):  # a pyenv shim is on PATH even where it runs no such Python
        probe = run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout=RUN_TIMEOUT)
        if probe.returncode == 0 and probe.stdout.strip() == oldest:
            return str(candidate)
    return None


@dataclass(frozen=True)
class Installed:
    """A fresh virtual environment with tfgpu_magic installed the way a user does, and an IPython dir of
    its own (so no profile of the machine is read or written)."""

    venv: Path
    home: Path
    env: dict[str, str]
    package_dir: Path
    """Where `import tfgpu_magic` must come from: the venv's site-packages, or the clone (editable)."""

    def ipython(self, code: str) -> subprocess.CompletedProcess[str]:
        """`ipython -c CODE` in the venv, started from an empty folder (not the checkout)."""
        argv: list[str | Path] = [self.venv / "bin" / "ipython", "--no-banner", "-c", code]
        return run(argv, cwd=self.home, env=self.env, timeout=RUN_TIMEOUT)

    @property
    def profile(self) -> Path:
        return Path(self.env["IPYTHONDIR"]) / "profile_default"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def jupyter(self, *args: str, env: dict[str, str]) -> str:
        """The output of `jupyter ARGS` in the venv (failing the test when it fails), without colours."""
        done = run([self.venv / "bin" / "jupyter", *args], cwd=self.home, env={**env, "NO_COLOR": "1"},
                   timeout=RUN_TIMEOUT)
        output = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
        assert done.returncode == 0, output
        return output


HOW = {
    "wheel": ("this", "wheel"),
    "clone, pip install -e .": ("this", "editable"),
    "wheel, oldest Python": ("oldest", "wheel"),
}
"""The README's ways to install: (which Python, what pip installs). The clone is a fresh copy of this
source, with nothing built in it: its install builds the JupyterLab extension."""


@pytest.fixture(scope="module", params=list(HOW))
def installed(
    request: pytest.FixtureRequest, dists: Dists, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """`dists` installed into a fresh venv, as `HOW[request.param]` says."""
    python_kind, how = HOW[request.param]
    python = sys.executable
    if python_kind == "oldest":
        found = oldest_python()
        if found is None:
            pytest.skip("no interpreter here for the oldest Python that python_requires admits")
        python = found
    tmp = tmp_path_factory.mktemp("venv")
    venv = tmp / "venv"
    created = run([python, "-m", "venv", venv], timeout=INSTALL_TIMEOUT)
    assert created.returncode == 0, created.stderr
    vpython = venv / "bin" / "python"
    jupyter = run([vpython, "-m", "pip", "install", "--quiet", JUPYTER], timeout=INSTALL_TIMEOUT, cwd=tmp)
    check(jupyter, vpython, tmp, JUPYTER, f"pip install {JUPYTER}")
    clone = tmp / "clone"
    if how == "wheel":
        result = run([vpython, "-m", "pip", "install", "--quiet", dists.wheel], timeout=INSTALL_TIMEOUT, cwd=tmp)
    else:
        copy_source(clone)
        result = run([vpython, "-m", "pip", "install", "--quiet", "-e", "."], timeout=INSTALL_TIMEOUT, cwd=clone)
    check(result, vpython, tmp, "hatchling", f"pip install {how}")
    home = tmp / "home"
    home.mkdir()
    env = quiet_env(**isolated_env(tmp / "jupyter"), PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)  # the venv sees its own site-packages only
    where_to = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    located = run([vpython, "-c", where_to], cwd=home, env=env, timeout=RUN_TIMEOUT)
    package_dir = (Path(located.stdout.strip()) if how == "wheel" else clone) / "tfgpu_magic"
    yield Installed(venv=venv, home=home, env=env, package_dir=package_dir)
    shutil.rmtree(tmp, ignore_errors=True)  # a venv is ~30 MB; pytest would keep the last three runs


def test_load_ext_and_a_directive_work_without_tensorflow(installed: Installed) -> None:
    code = "\n".join([
        "%load_ext tfgpu_magic",
        "%tfgpu growth on",
        "import sys, tfgpu_magic",
        "print('FROM', tfgpu_magic.__file__)",
        f"print('HEAVY', sorted(set({list(HEAVY_MODULES)!r}) & set(sys.modules)))",
    ])
    result = installed.ipython(code)
    assert result.returncode == 0, result.stdout + result.stderr
    assert RECORDED in result.stdout.splitlines(), result.stdout
    assert f"FROM {installed.package_dir / '__init__.py'}" in result.stdout, result.stdout
    assert "HEAVY []" in result.stdout, "tensorflow, ipywidgets and pynvml stay unimported"
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_ipython_config_loads_the_extension_in_every_shell(installed: Installed) -> None:
    installed.profile.mkdir(parents=True, exist_ok=True)
    config = installed.profile / "ipython_config.py"
    config.unlink(missing_ok=True)
    without = installed.ipython(HAS_MAGIC)
    assert without.returncode == 0 and without.stdout.strip() == "False", without.stdout + without.stderr
    config.write_text(CONFIG_LINE + "\n")
    try:
        with_config = installed.ipython(HAS_MAGIC)
    finally:
        config.unlink()
    assert with_config.returncode == 0, with_config.stdout + with_config.stderr
    assert with_config.stdout.strip() == "True", with_config.stdout + with_config.stderr


def test_autoload_loads_the_extension_in_the_next_shell(installed: Installed) -> None:
    """The README's other way to load it everywhere, from the installed package (not this checkout)."""
    turned_on = installed.ipython("%load_ext tfgpu_magic\n%tfgpu autoload on")
    assert turned_on.returncode == 0, turned_on.stdout + turned_on.stderr
    try:
        next_shell = installed.ipython(HAS_MAGIC)
    finally:
        turned_off = installed.ipython("%tfgpu autoload off")
    assert next_shell.stdout.strip() == "True", next_shell.stdout + next_shell.stderr
    assert turned_off.returncode == 0, turned_off.stdout + turned_off.stderr
    after = installed.ipython(HAS_MAGIC)
    assert after.stdout.strip() == "False", after.stdout + after.stderr


def page_config(html: str) -> dict[str, Any]:
    """The settings JupyterLab's page hands to the browser (its `jupyter-config-data` script)."""
    found = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', html, re.S)
    assert found, html[:2000]
    return json.loads(found.group(1))


def test_the_install_alone_enables_the_server_extension_and_the_labextension(installed: Installed) -> None:
    """Jupyter in the venv, with Jupyter dirs of its own and no config written by anyone, lists both
    extensions enabled, the server extension by the venv's own config (sys-prefix); its server answers
    /api/tfgpu/gpus, and JupyterLab's page asks the browser to load the labextension (the status item and
    the sidebar)."""
    version = json.loads((ROOT / "labextension" / "package.json").read_text())["version"]
    with isolated_jupyter("tfgpu-install-") as jupyter_env:
        env = jupyter_env.environ
        env.pop("PYTHONPATH", None)  # the venv sees its own site-packages only
        env["PYTHONNOUSERSITE"] = "1"
        assert not [*jupyter_env.config_dir.iterdir()], "no config of the test's own"
        servers = installed.jupyter("server", "extension", "list", env=env)
        sections = {part.split("\n", 1)[0].strip(): part for part in servers.split("Config dir:")[1:]}
        enabling = [Path(folder).resolve() for folder, text in sections.items()
                    if re.search(r"tfgpu_magic\.serverext\s+enabled", text)]
        assert enabling == [(installed.venv / "etc" / "jupyter").resolve()], servers
        labextensions = installed.jupyter("labextension", "list", env=env)
        assert re.search(rf"tfgpu-magic v{re.escape(version)} enabled\s+OK", labextensions), labextensions
        with running_server(jupyter_env, app="jupyterlab", python=installed.python) as server:
            reply = server.request("GET", "api/tfgpu/gpus")  # an HTTP error (404: not enabled) raises
            assert isinstance(reply["gpus"], list), reply
            request = urllib.request.Request(f"{server.url}lab", headers={"Authorization": f"token {server.token}"})
            with NO_PROXY.open(request, timeout=RUN_TIMEOUT) as page:
                assert page.status == 200
                config = page_config(page.read().decode())
    loaded = [extension["name"] for extension in config["federated_extensions"]]
    assert "tfgpu-magic" in loaded, loaded
    assert "tfgpu-magic" not in config.get("disabledExtensions", []), config["disabledExtensions"]
