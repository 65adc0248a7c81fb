"""Fixtures shared by the modules that drive `%tfgpu` on the real test IPython shell."""

from __future__ import annotations

from typing import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell
from shells import loaded_shell

from tfgpu_magic.tf import importhook


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InteractiveShell]:
    """The test IPython shell with the extension loaded (see `shells.loaded_shell`)."""
    yield loaded_shell(tmp_path_factory)
    importhook.disarm()
