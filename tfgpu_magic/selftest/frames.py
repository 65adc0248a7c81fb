"""The selftest's framed lines: how a child process hands its result to the process that started it.

A child's stdout also carries whatever else runs there: a user's `sitecustomize`, TensorFlow's
noise, a print in a startup file. So every run makes a random nonce, hands it to the child, and the
child writes each result as one line `\\n<nonce> <JSON object>\\n` (the leading newline ends a line
someone else left open). The reader keeps only lines that begin with its nonce, each at most
`LIMIT` bytes, and never holds any other output: nothing else on stdout can crash it or pass for a
result. The probes write the same line from their own text (`probes.PRELUDE`), without importing
this package.
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Any, Callable

LIMIT = 4 * 1024 * 1024
"""Longest framed line read, in bytes (a probe's figures are a few kB; the doctor's checks, tens)."""


def new_nonce() -> str:
    return secrets.token_hex(16)


def encode(nonce: str, payload: dict[str, Any]) -> bytes:
    """One framed line for `payload` (a JSON object)."""
    return b"\n" + nonce.encode() + b" " + json.dumps(payload, ensure_ascii=False).encode() + b"\n"


def write(nonce: str, payload: dict[str, Any], fd: int = 1) -> None:
    """Write `payload` framed on `fd` at once (past any buffered `sys.stdout` text someone printed)."""
    data = memoryview(encode(nonce, payload))
    while data:
        data = data[os.write(fd, data):]


class Reader:
    """Fed a child's stdout in chunks: keeps the JSON objects framed with `nonce`, in order, and
    calls `on_frame` with each as it arrives; `rejected` says why a framed line was not taken."""

    def __init__(self, nonce: str, on_frame: Callable[[dict[str, Any]], None] | None = None,
                 limit: int = LIMIT) -> None:
        self.prefix = nonce.encode() + b" "
        self.on_frame = on_frame
        self.limit = limit
        self.frames: list[dict[str, Any]] = []
        self.rejected: list[str] = []
        self._line = bytearray()
        self._skipping = False
        """The current line cannot be a frame (or is too long): drop it up to its newline."""

    def feed(self, chunk: bytes) -> None:
        while chunk:
            end = chunk.find(b"\n")
            part, chunk = (chunk, b"") if end < 0 else (chunk[:end], chunk[end + 1:])
            if not self._skipping:
                self._line += part
                self._check()
            if end >= 0:
                if not self._skipping and self._line:
                    self._take(bytes(self._line))
                self._line.clear()
                self._skipping = False

    def _check(self) -> None:
        """Stop holding a line once it cannot be a frame, or has grown past the limit."""
        head = bytes(self._line[:len(self.prefix)])
        if not self.prefix.startswith(head):
            self._drop()
        elif len(self._line) > self.limit:
            self.rejected.append(f"a framed line longer than {self.limit} bytes")
            self._drop()

    def _drop(self) -> None:
        self._skipping = True
        self._line.clear()

    def _take(self, line: bytes) -> None:
        if not line.startswith(self.prefix):
            return
        try:
            payload = json.loads(line[len(self.prefix):].decode())  # UTF-8, as `encode` writes it
        except (ValueError, RecursionError) as err:  # ValueError includes UnicodeDecodeError
            self.rejected.append(f"a framed line that is not JSON ({type(err).__name__})")
            return
        if not isinstance(payload, dict):
            self.rejected.append(f"a framed line holding a JSON {type(payload).__name__}, not an object")
            return
        self.frames.append(payload)
        if self.on_frame is not None:
            self.on_frame(payload)
