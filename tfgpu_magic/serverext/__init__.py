"""The Jupyter server extension: GPUs, their processes and this server's kernels, for the JupyterLab
extension (`labextension/`) — answered while the kernels are busy.

Enabled on install by `jupyter-config/jupyter_server_config.d/tfgpu_magic.json`; its handlers are in
`handlers`, what they answer is put together in `gather`. Importing this package imports neither
jupyter_server nor NVML: the server calls `_load_jupyter_server_extension` when it starts.
"""

from __future__ import annotations

from typing import Any

LABEXTENSION = "tfgpu-magic"
"""The labextension's npm name: its folder under `share/jupyter/labextensions`."""


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """What jupyter_server loads for `jpserver_extensions: {"tfgpu_magic.serverext": true}`."""
    return [{"module": "tfgpu_magic.serverext"}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the built labextension lies, relative to this package (for `jupyter labextension develop`)."""
    return [{"src": "../labextension", "dest": LABEXTENSION}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Add the `/api/tfgpu/...` handlers to `serverapp`."""
    from .handlers import setup_handlers

    setup_handlers(serverapp)
