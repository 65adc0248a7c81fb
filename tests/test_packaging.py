"""The package as users get it: the wheel and sdist that `python -m build` makes from this source pass
`twine check` and carry the LICENSE, and the wheel built from the sdist needs no Node.js; installed into a
fresh virtual environment as the README says (the wheel, or `pip install -e .` in a clone), `%load_ext
tfgpu_magic` and `ipython_config.py`'s `c.InteractiveShellApp.extensions` work without TensorFlow, and the
install alone enables the server extension and the JupyterLab extension: nobody writes a Jupyter config.

The build and the installs fetch hatchling, hatch-jupyter-builder and what tfgpu_magic requires from the
package index (pip's cache is fine); they skip, with pip's message, when pip cannot download from it, and
never for a failure with the index in reach. Building the JupyterLab extension in a clone needs node and npm
(npm's cache is fine). The oldest Python that python_requires admits is tried where this machine has it (on
PATH or pyenv's); else those cases skip, saying so.

JupyterLab, which a user has beside tfgpu_magic, is what these tests start, not what they test: a venv on
this Python takes it (and pip, IPython, traitlets, ipywidgets, with what they require) from the environment
running the tests, linked in before tfgpu_magic is installed (`link_dependencies`; the venv is checked to hold
no tfgpu_magic, TensorFlow or NVML then), so `pip install` there installs tfgpu_magic alone, into the venv;
the oldest Python's venv gets them from pip. The builds and the installs start together (`Workshop`), each in
a folder of its own, removed in the background after the module.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import urllib.request
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest
from kernels import isolated_env, quiet_env
from kernels import HEAVY_MODULES
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
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
"""docs/restart.md's way to load the extension in every kernel of a profile."""
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


def build_dists(tmp: Path) -> Dists:
    """The sdist, and the wheel built from it, as `python -m build` makes them for a release (it builds the
    sdist, then the wheel from the sdist unpacked): here the wheel's build sees no node or npm."""
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


@pytest.fixture(scope="module")
def dists(workshop: Workshop) -> Dists:
    """`build_dists`, made once for the module (by the workshop, beside the venvs)."""
    return workshop.dists.result()


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
    site_packages: Path
    """The venv's own, where pip puts tfgpu_magic's metadata (its entry points) for either way."""
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
source, with nothing built in it: its install builds the JupyterLab extension (`npm install`, finding the
packages the sdist's build installed from nothing moved there, then `npm run build`)."""
NODE_MODULES = Path("labextension", "node_modules")
"""npm's install in a source: some 30,000 files (half a minute of CPU), made once here."""
FOUND = ("import importlib.util as u; "
         "print(*[n for n in ('tfgpu_magic', 'tensorflow', 'pynvml', 'jupyterlab') if u.find_spec(n)])")
"""In a venv: which of tfgpu_magic, TensorFlow, NVML and JupyterLab it can import."""
CONSOLE_SCRIPT = """#!{python}
import sys
from {module} import {name}
if __name__ == "__main__":
    sys.exit({call}())
"""
"""A console script as pip writes one (`module:name.call`), run by the venv's Python."""


def closure(requirements: Iterable[str]) -> list[importlib.metadata.Distribution]:
    """The distributions of the environment running these tests that `pip install REQUIREMENTS` would
    bring: each one named, and what it requires (with the extras asked for, markers evaluated here), and so
    on; one this environment lacks is left for pip."""
    found: dict[str, importlib.metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo = [Requirement(text) for text in requirements]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        try:
            dist = found.get(name) or importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[name] = dist
        for extra in {"", *requirement.extras} - {extra for seen, extra in done if seen == name}:
            done.add((name, extra))
            needs = [Requirement(text) for text in dist.requires or ()]
            todo += [need for need in needs if need.marker is None or need.marker.evaluate({"extra": extra})]
    return list(found.values())


def link_dependencies(venv: Path, overlay: Path, requirements: Iterable[str]) -> None:
    """`closure(requirements)` made part of `venv` without pip, as installed here: their modules through
    one .pth file in the venv's site-packages naming `overlay` (a folder of links to them: a folder outside
    the venv, which pip never uninstalls from), their data files (JupyterLab's assets, their Jupyter
    configs) copied under the venv's prefix, their console scripts written for the venv's Python."""
    prefix, site_packages = Path(sys.prefix), Path(sysconfig.get_paths()["purelib"])
    overlay.mkdir()
    for dist in closure(requirements):
        for script in dist.entry_points.select(group="console_scripts"):
            module, _, call = script.value.partition(":")
            path = venv / "bin" / script.name
            path.write_text(CONSOLE_SCRIPT.format(python=venv / "bin" / "python", module=module.strip(),
                                                  name=call.strip().split(".")[0], call=call.strip()))
            path.chmod(0o755)
        for file in dist.files or ():
            path = Path(os.path.normpath(dist.locate_file(file)))
            if path.is_relative_to(site_packages):
                top = path.relative_to(site_packages).parts[0]
                if top != "__pycache__" and not (overlay / top).is_symlink():
                    (overlay / top).symlink_to(site_packages / top)
            elif path.is_relative_to(prefix) and path.relative_to(prefix).parts[0] in ("share", "etc"):
                copy = venv / path.relative_to(prefix)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, copy)
    venv_site_packages = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (venv_site_packages / "tests-dependencies.pth").write_text(f"{overlay}\n")


def install(way: str, python: str, tmp: Path, dists: Future[Dists]) -> Installed:
    """tfgpu_magic installed into a fresh venv under `tmp` as `HOW[way]` says, after JupyterLab (and pip)
    linked in on this Python (`link_dependencies`), else from pip; the venv is shown to hold no tfgpu_magic,
    TensorFlow or NVML before."""
    python_kind, how = HOW[way]
    venv = tmp / "venv"
    linked = python_kind == "this"
    created = run([python, "-m", "venv", *(["--without-pip"] if linked else []), venv], timeout=INSTALL_TIMEOUT)
    assert created.returncode == 0, created.stderr
    vpython = venv / "bin" / "python"
    home = tmp / "home"
    home.mkdir()
    env = quiet_env(**isolated_env(tmp / "jupyter"), PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)  # the venv sees its own site-packages (and what its .pth names) only
    if linked:
        link_dependencies(venv, tmp / "dependencies", ["pip", JUPYTER, *pyproject()["project"]["dependencies"]])
    else:
        jupyter = run([vpython, "-m", "pip", "install", "--quiet", JUPYTER], timeout=INSTALL_TIMEOUT, cwd=tmp)
        check(jupyter, vpython, tmp, JUPYTER, f"pip install {JUPYTER}")
    before = run([vpython, "-c", FOUND], cwd=home, env=env, timeout=RUN_TIMEOUT)
    assert before.stdout.split() == ["jupyterlab"], before.stdout + before.stderr
    assert not [*venv.glob("share/jupyter/labextensions/tfgpu*")] and not [*venv.glob("etc/jupyter/*/tfgpu*")]
    clone = tmp / "clone"
    if how == "wheel":
        wheel = dists.result().wheel
        result = run([vpython, "-m", "pip", "install", "--quiet", wheel], timeout=INSTALL_TIMEOUT, cwd=tmp)
    else:
        copy_source(clone)
        npm_installed = dists.result().source / NODE_MODULES
        if npm_installed.is_dir():  # npm's install from nothing is the sdist build's; the clone's build is its own
            npm_installed.rename(clone / NODE_MODULES)
        result = run([vpython, "-m", "pip", "install", "--quiet", "-e", "."], timeout=INSTALL_TIMEOUT, cwd=clone)
    check(result, vpython, tmp, "hatchling", f"pip install {how}")
    where_to = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_packages = Path(run([vpython, "-c", where_to], cwd=home, env=env, timeout=RUN_TIMEOUT).stdout.strip())
    package_dir = (site_packages if how == "wheel" else clone) / "tfgpu_magic"
    return Installed(venv=venv, home=home, env=env, site_packages=site_packages, package_dir=package_dir)


@dataclass
class Workshop:
    """The builds and installs the selected tests of this module need, all started at once: the dists, and
    beside them each way's venv with JupyterLab; then, the sdist built, the installs of tfgpu_magic."""

    folders: list[Path] = field(default_factory=list)
    """Where it builds and installs: removed after the module, in the background (`remove_in_background`)."""
    dists: Future[Dists] = field(default_factory=Future)
    installs: dict[str, Future[Installed]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    """Why an install way cannot be tried here (no such Python)."""

    def folder(self, factory: pytest.TempPathFactory, name: str) -> Path:
        self.folders.append(factory.mktemp(name))
        return self.folders[-1]

    def installed(self, way: str) -> Installed:
        """The install made `way` (raising, or skipping, as making it did)."""
        if way in self.skipped:
            pytest.skip(self.skipped[way])
        return self.installs[way].result()


def remove_in_background(folders: list[Path]) -> None:
    """Remove `folders` (venvs, node_modules: tens of thousands of files) in a thread that outlives the
    module: on a disk that discards freed blocks that is a minute of waiting, little CPU. The interpreter
    waits for the thread at exit; pytest would keep the last three runs' folders."""
    cleaner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="packaging-cleanup")
    for folder in folders:
        cleaner.submit(shutil.rmtree, folder, ignore_errors=True)
    cleaner.shutdown(wait=False)


@pytest.fixture(scope="module")
def workshop(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workshop]:
    """A `Workshop` making the dists and the install ways that this session's tests of the module name."""
    items = [item for item in request.session.items if item.module is request.module]
    ways = sorted({item.callspec.params["installed"] for item in items if "installed" in item.fixturenames})
    shop = Workshop()
    try:
        with ThreadPoolExecutor(max_workers=1 + len(ways), thread_name_prefix="packaging") as pool:
            shop.dists = pool.submit(build_dists, shop.folder(tmp_path_factory, "packaging"))
            for way in ways:
                python = sys.executable if HOW[way][0] == "this" else oldest_python()
                if python is None:
                    shop.skipped[way] = "no interpreter here for the oldest Python that python_requires admits"
                    continue
                folder = shop.folder(tmp_path_factory, "venv")
                shop.installs[way] = pool.submit(install, way, python, folder, shop.dists)
            yield shop
    finally:
        remove_in_background(shop.folders)


@pytest.fixture(scope="module", params=list(HOW))
def installed(request: pytest.FixtureRequest, workshop: Workshop) -> Installed:
    """tfgpu_magic installed into a fresh venv, as `HOW[request.param]` says (`install`)."""
    return workshop.installed(request.param)


def test_load_ext_and_a_directive_work_without_tensorflow(installed: Installed) -> None:
    code = "\n".join([
        "%load_ext tfgpu_magic",
        "%tfgpu growth on",
        "import importlib.metadata, sys, tfgpu_magic",
        "print('FROM', tfgpu_magic.__file__)",
        "ours = [dist.locate_file('') for dist in importlib.metadata.distributions() if dist.name == 'tfgpu_magic']",
        "print('METADATA', *ours)",
        f"print('HEAVY', sorted(set({list(HEAVY_MODULES)!r}) & set(sys.modules)))",
    ])
    result = installed.ipython(code)
    assert result.returncode == 0, result.stdout + result.stderr
    assert RECORDED in result.stdout.splitlines(), result.stdout
    assert f"FROM {installed.package_dir / '__init__.py'}" in result.stdout, result.stdout
    assert f"METADATA {installed.site_packages}" in result.stdout.splitlines(), "one tfgpu_magic, the install's"
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
    """docs/restart.md's other way to load it everywhere, from the installed package (not this checkout)."""
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
    extensions enabled, the server extension by the venv's own config (sys-prefix), the labextension from
    the venv's own share/jupyter (where only the install put it: `install`); its server answers
    /api/tfgpu/gpus, and JupyterLab's page asks the browser to load the labextension (the status item and
    the sidebar)."""
    version = json.loads((ROOT / "labextension" / "package.json").read_text())["version"]
    with isolated_jupyter("tfgpu-install-") as jupyter_env:
        env = jupyter_env.environ
        env.pop("PYTHONPATH", None)  # the venv sees its own site-packages (and what its .pth names) only
        env["PYTHONNOUSERSITE"] = "1"
        assert not [*jupyter_env.config_dir.iterdir()], "no config of the test's own"
        with ThreadPoolExecutor(max_workers=2) as listings:  # each takes seconds of CPU: beside the server's start
            servers_listed = listings.submit(installed.jupyter, "server", "extension", "list", env=env)
            labextensions_listed = listings.submit(installed.jupyter, "labextension", "list", env=env)
            with running_server(jupyter_env, app="jupyterlab", python=installed.python) as server:
                reply = server.request("GET", "api/tfgpu/gpus")  # an HTTP error (404: not enabled) raises
                assert isinstance(reply["gpus"], list), reply
                request = urllib.request.Request(f"{server.url}lab", headers={"Authorization": f"token {server.token}"})
                with NO_PROXY.open(request, timeout=RUN_TIMEOUT) as page:
                    assert page.status == 200
                    config = page_config(page.read().decode())
            servers, labextensions = servers_listed.result(), labextensions_listed.result()
    sections = {part.split("\n", 1)[0].strip(): part for part in servers.split("Config dir:")[1:]}
    enabling = [Path(folder).resolve() for folder, text in sections.items()
                if re.search(r"tfgpu_magic\.serverext\s+enabled", text)]
    assert enabling == [(installed.venv / "etc" / "jupyter").resolve()], servers
    assert re.search(rf"tfgpu-magic v{re.escape(version)} enabled\s+OK", labextensions), labextensions
    folders = re.findall(r"^(/\S*)\n((?:[ \t]+.*\n?)*)", labextensions, re.M)  # a folder, then its extensions
    listing = [Path(folder).resolve() for folder, text in folders if re.search(r"^\s+tfgpu-magic v", text, re.M)]
    assert listing == [(installed.venv / "share" / "jupyter" / "labextensions").resolve()], labextensions
    loaded = [extension["name"] for extension in config["federated_extensions"]]
    assert "tfgpu-magic" in loaded, loaded
    assert "tfgpu-magic" not in config.get("disabledExtensions", []), config["disabledExtensions"]
