"""The other frameworks a kernel may import beside TensorFlow: JAX (`jax`), PyTorch (`torch`) and
Keras 3's backend (`keras`). Each module is the only one that touches its framework, and reads it from
`sys.modules`, never importing it: the policy reaches JAX through its environment variables before its
backends start, and PyTorch through its allocator configuration and a per-device memory fraction queued
for when its CUDA starts."""

from __future__ import annotations

from typing import NamedTuple


class FrameworkView(NamedTuple):
    """Another framework as the status shows it: what it is, where it is in its life, what it was told."""

    name: str
    """`jax`, `torch` or `keras`."""
    version: str | None
    imported: bool
    started: bool
    """JAX's backends, PyTorch's CUDA: started (what it reads then is fixed until restart)."""
    variables: tuple[tuple[str, str], ...] = ()
    """Its variables as set now."""
    fractions: tuple[tuple[int, float], ...] = ()
    """PyTorch: the per-device memory fractions the policy asks for."""
    cuda_build: bool | None = None
    """PyTorch: built with CUDA (None: unknown)."""
    backend: str | None = None
    """Keras: its backend, and where it comes from (`backend_source`)."""
    backend_source: str | None = None


class FrameworkMemory(NamedTuple):
    """One device's memory as JAX or PyTorch itself counts it, in bytes (`Controller.framework_memory`)."""

    device: str
    """The framework's name for it: `gpu:0` (JAX), `cuda:0` (PyTorch)."""
    card: str | None
    """The card's UUID, placed by CUDA's order of this process's GPUs (None: unknown)."""
    current: int
    """In use now: JAX's bytes in use, PyTorch's allocated."""
    peak: int | None
    """JAX's peak in use (None: PyTorch, whose peak is not read)."""
    reserved: int | None
    """JAX's pool limit, PyTorch's reserved (None: not given)."""
