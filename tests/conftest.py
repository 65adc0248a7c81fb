"""Fixtures shared by the modules that drive `%tfgpu` on the real test IPython shell."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Callable, Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell
from shells import loaded_shell

from tfgpu_magic.frameworks import jax, torch
from tfgpu_magic.tf import quietimport

KERAS_HOME = tempfile.mkdtemp(prefix="tfgpu-keras-home-")
"""Keras writes keras.json under KERAS_HOME (else ~/.keras) when imported: the tests' own, never the
tester's home. Kernels and subprocesses inherit it (`kernels.quiet_env`)."""
os.environ["KERAS_HOME"] = KERAS_HOME
atexit.register(shutil.rmtree, KERAS_HOME, ignore_errors=True)


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InteractiveShell]:
    """The test IPython shell with the extension loaded (see `shells.loaded_shell`)."""
    yield loaded_shell(tmp_path_factory)
    quietimport.disarm()


@pytest.fixture
def installed_frameworks(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """`installed_frameworks(jax_installed=..., torch_installed=...)`: which of JAX and PyTorch count as installed (found, not
    imported), whatever this environment holds; the status shows a line for one the policy tells something,
    and a hook waits for its import."""

    def pretend(jax_installed: bool = False, torch_installed: bool = False) -> None:
        monkeypatch.setattr(jax, "installed", lambda: jax_installed)
        monkeypatch.setattr(torch, "installed", lambda: torch_installed)

    return pretend


@pytest.fixture
def tensorflow_alone(installed_frameworks: Callable[..., None]) -> None:
    """Neither JAX nor PyTorch installed, as for a user of TensorFlow alone."""
    installed_frameworks()
