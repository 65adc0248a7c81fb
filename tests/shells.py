"""The test IPython shell with the extension loaded, for modules that drive `%tfgpu` on it."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.profiledir import ProfileDir
from IPython.testing import globalipapp


def loaded_shell(tmp_path_factory: pytest.TempPathFactory) -> InteractiveShell:
    """The global test shell with the extension loaded the way a user loads it, from an empty profile
    (no saved default policy reaches os.environ).

    Through the module's `get_ipython`, which names the shell once started: the function imported by
    name (`from ... import get_ipython`) returns None after its first call, so a second test module
    in the same process would get no shell."""
    ip = globalipapp.get_ipython()
    empty = ProfileDir.create_profile_dir(str(tmp_path_factory.mktemp("profile")))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ip, "profile_dir", empty)
        ip.run_line_magic("load_ext", "tfgpu_magic")
    return ip
