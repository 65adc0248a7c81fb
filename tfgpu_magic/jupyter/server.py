"""The Jupyter server that owns this kernel: found, proven, and asked over loopback.

A server's token goes only to the server that owns this kernel, proven locally before any request:
its `jpserver-<pid>.json` names a live process that is an ancestor of this kernel (the server
started it, directly or through a kernelspec's wrapper), that process itself holds the socket
listening on the very address and port the request goes to (the kernel's listening sockets against
its file descriptors, on Linux: a server on [::1] only is asked at [::1], never at 127.0.0.1, where
another user may listen on the same port), and the server then lists this kernel id.
Requests go over loopback only (a server listening on every interface is reached at 127.0.0.1 or
::1) with `http.client`, which never reads proxy variables and never follows a redirect; for `https`
the certificate is not checked (servers on loopback use self-signed ones) since the ancestor pid and
the loopback port already identify the server. Tokens are never printed or logged.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from . import persist
from .. import safefile
from ..errors import PolicyError, short_error, warn

HTTP_TIMEOUT = 3.0
REPLY_BYTES = 1 << 20
"""Largest server reply read."""
ANCESTOR_DEPTH = 16
TCP_LISTEN = 10
"""A listening socket's state (include/net/tcp_states.h); /proc/net/tcp writes it in hex."""
LISTEN_STATE = f"{TCP_LISTEN:02X}"
WILDCARD_HOSTS = {
    "": ("127.0.0.1", "::1"), "0.0.0.0": ("127.0.0.1",), "localhost": ("127.0.0.1", "::1"), "::": ("::1", "127.0.0.1"),  # noqa: S104
}  # fmt: skip
"""Server `hostname`s (its `--ip`) and the loopback addresses that may reach such a server here."""
TCP_TABLES = {4: Path("/proc/net/tcp"), 6: Path("/proc/net/tcp6")}
"""The kernel's table of TCP sockets for each IP version."""


class Server(NamedTuple):
    """A Jupyter server on loopback that owns this kernel. `repr` hides the token."""

    url: str
    token: str
    pid: int
    hub_token: str = ""

    def __repr__(self) -> str:
        return f"Server(url={self.url!r}, pid={self.pid})"

    @classmethod
    def from_info(cls, info: dict[str, Any], url: str, pid: int) -> Server:
        """The server of `info` (a `jpserver-*.json`), reached at `url`."""
        token = info.get("token")
        return cls(url, token if isinstance(token, str) else "", pid, os.environ.get("JUPYTERHUB_API_TOKEN", ""))

    def request(self, method: str, path: str) -> Any:
        """An authenticated request; the decoded JSON reply (None when empty). No proxy, no
        redirect (a 3xx is a refusal). Raises OSError when the server cannot be reached or refuses,
        `PolicyError` for a reply that is not sensible JSON."""
        import http.client  # not at import time: %load_ext must stay cheap

        headers = {"Authorization": f"token {self.token or self.hub_token}"} if self.token or self.hub_token else {}
        body = None
        if method == "POST":
            body = b"{}"
            headers["Content-Type"] = "application/json"
        connection, base = _connection(self.url)
        try:
            connection.request(method, base.rstrip("/") + "/" + path.lstrip("/"), body=body, headers=headers)
            reply = connection.getresponse()
            if not 200 <= reply.status < 300:
                raise OSError(f"HTTP Error {reply.status}: {reply.reason}")
            data = reply.read(REPLY_BYTES + 1)
        except http.client.HTTPException as err:  # a malformed or cut reply: not an OSError of its own
            raise OSError(f"the server at {self.url} sent no proper HTTP reply ({short_error(err)})") from None
        finally:
            connection.close()
        if len(data) > REPLY_BYTES:
            raise PolicyError(f"the server at {self.url} sent a reply over {REPLY_BYTES} bytes")
        try:
            return safefile.loads(data.decode("utf-8"), f"the reply of the server at {self.url}") if data else None
        except UnicodeDecodeError:
            raise PolicyError(f"the server at {self.url} sent a reply that is not UTF-8") from None


def _connection(url: str) -> tuple[Any, str]:
    """An `http.client` connection to the host and port of `url` (https without certificate checks:
    loopback only, the server is identified by pid, see the module docstring), and the URL's base path."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "https":
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT), parts.path
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT, context=context), parts.path


def ancestors() -> list[int]:
    """This process's parent, its parent, … (only the parent where /proc is missing)."""
    pids = [os.getppid()]
    while len(pids) < ANCESTOR_DEPTH:
        try:
            stat = Path(f"/proc/{pids[-1]}/stat").read_text(encoding="ascii", errors="replace")
            parent = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if parent < 1:
            break
        pids.append(parent)
        if parent == 1:  # a server running as the container's init is an ancestor too
            break
    return pids


def _address(hex_address: str) -> str:
    """The IP address of a /proc/net/tcp{,6} `local_address` field's address part (each 32-bit word
    is stored in host byte order, little-endian here)."""
    raw = bytes.fromhex(hex_address)
    return str(ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))))


def listening_addresses(pid: int, port: int, versions: tuple[int, ...] = (4, 6)) -> set[str] | None:
    """The local addresses ('127.0.0.1', '::', …) of the sockets that process `pid` itself holds
    listening on `port`, among IP `versions` (the kernel's listening sockets against the process's file
    descriptors); None where this cannot be told (not Linux)."""
    sockets = listening_sockets(versions)
    if sockets is None:
        return None
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return set()
    inodes = set()
    for fd in descriptors:
        try:
            inodes.add(os.readlink(fd))
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            continue
    return {address for address, at, inode in sockets if at == port and f"socket:[{inode}]" in inodes}


def listening_sockets(versions: tuple[int, ...] = (4, 6)) -> list[tuple[str, int, int]] | None:
    """(address, port, inode) of every listening TCP socket of this network namespace, among IP
    `versions`: asked through netlink (sock_diag, what `ss -lt` asks), which lists listening sockets
    only, and else read from /proc/net/tcp{,6}, which the kernel builds by walking every connection
    (milliseconds on a machine with much memory). None where neither exists (not Linux)."""
    try:
        return [found for version in versions for found in _diag_listening(version)]
    except (OSError, ValueError, struct.error):
        pass
    if not TCP_TABLES[4].exists():
        return None
    return [found for version in versions for found in _table_listening(TCP_TABLES[version])]


NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST_DUMP = 0x301
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN_STATES = 1 << TCP_LISTEN
"""The state mask of `inet_diag_req_v2` that asks for listening sockets only."""
DIAG_REPLY_BYTES = 1 << 16
DIAG_TIMEOUT = 1.0


def _diag_listening(version: int) -> list[tuple[str, int, int]]:
    """The listening TCP sockets of IP `version`, from one sock_diag dump (`inet_diag_req_v2` asked,
    `inet_diag_msg` answered: https://man7.org/linux/man-pages/man7/sock_diag.7.html). OSError,
    ValueError or struct.error where the kernel offers no such dump or answers otherwise."""
    family = socket.AF_INET if version == 4 else socket.AF_INET6
    request = struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, TCP_LISTEN_STATES)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as channel:
        channel.settimeout(DIAG_TIMEOUT)
        channel.send(struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP, 1, 0) + request)
        found: list[tuple[str, int, int]] = []
        while True:
            data = channel.recv(DIAG_REPLY_BYTES)
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR or length < 16 + 72:
                    raise ValueError("sock_diag answered with an error")
                reply_family, state = struct.unpack_from("=BB", data, offset + 16)
                if reply_family == family and state == TCP_LISTEN:
                    port = struct.unpack_from("!H", data, offset + 20)[0]
                    raw = data[offset + 24 : offset + 24 + (4 if version == 4 else 16)]
                    inode = struct.unpack_from("=I", data, offset + 84)[0]
                    found.append((str(ipaddress.ip_address(raw)), port, inode))
                offset += (length + 3) & ~3
            if not data:
                raise ValueError("sock_diag ended without its last message")


def _table_listening(table: Path) -> list[tuple[str, int, int]]:
    """The listening sockets a /proc/net/tcp{,6} `table` lists ([] where it cannot be read)."""
    try:
        rows = table.read_text(encoding="ascii", errors="replace").splitlines()[1:]
    except OSError:
        return []
    found = []
    for row in rows:
        fields = row.split()
        if len(fields) < 10 or fields[3] != LISTEN_STATE:
            continue
        host, _, hex_port = fields[1].rpartition(":")
        try:
            found.append((_address(host), int(hex_port, 16), int(fields[9])))
        except ValueError:
            continue
    return found


def owner_host(candidates: list[str], listening: set[str]) -> str | None:
    """The first of `candidates` (loopback addresses) that a socket in `listening` surely receives a
    connection to: the same address, or the wildcard of its own family. An IPv6 wildcard may be
    IPv6-only, so it never vouches for 127.0.0.1: another user could hold 127.0.0.1 on that port."""
    for host in candidates:
        wildcard = "::" if ":" in host else "0.0.0.0"  # noqa: S104
        if host in listening or wildcard in listening:
            return host
    return None


def loopback_hosts(info: dict[str, Any]) -> list[str]:
    """The loopback addresses that may reach the server of `info` (a `jpserver-*.json`), best first;
    [] when it listens elsewhere only (a given remote or LAN address, a host name) or on a Unix socket."""
    host, port, base = info.get("hostname"), info.get("port"), info.get("base_url") or "/"
    if info.get("sock") or not isinstance(host, str) or not isinstance(base, str) or not base.startswith("/"):
        return []
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return []
    if host in WILDCARD_HOSTS:
        return list(WILDCARD_HOSTS[host])
    try:
        return [host] if ipaddress.ip_address(host).is_loopback else []
    except ValueError:  # a host name: where it points is not ours to trust
        return []


def server_url(info: dict[str, Any], pid: int) -> str | None:
    """The URL of the server of `info`, at a loopback address that process `pid` itself listens on
    (module docstring); None when there is none. Without /proc, the first loopback address."""
    candidates = loopback_hosts(info)
    versions = tuple(sorted({6 if ":" in host else 4 for host in candidates}))  # the tables owner_host reads
    listening = listening_addresses(pid, info["port"], versions) if candidates else set()
    host = candidates[0] if listening is None else owner_host(candidates, listening)
    if host is None:
        return None
    netloc = f"[{host}]" if ":" in host else host
    return f"{'https' if info.get('secure') is True else 'http'}://{netloc}:{info['port']}{info.get('base_url') or '/'}"


def server_files(directory: Path | None = None, quiet: bool = False) -> Iterator[tuple[Path, dict[str, Any], int]]:
    """(path, info, pid) of each `jpserver-*.json` in `directory` (default: the runtime dir) that reads
    as a private JSON object of this user naming an integer pid. Other files are skipped, each with one
    warning line unless `quiet`; nothing here proves that the server is alive or whose it is."""
    directory = directory or persist.runtime_dir()
    try:
        paths = sorted(directory.glob("jpserver-*.json"))
    except OSError:
        return
    for path in paths:
        try:
            info = safefile.read_json(path, safefile.SERVER_INFO_BYTES, private=True)
        except PolicyError as err:
            if not quiet:
                warn(f"ignoring a Jupyter server file: {err}")
            continue
        if not isinstance(info, dict):
            if not quiet:
                warn(f"ignoring {path}: not a Jupyter server file")
            continue
        pid = info.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool):
            yield path, info, pid


def find_server(kernel_id: str, runtime_dir: Path | None = None) -> Server | None:
    """The running Jupyter server that owns kernel `kernel_id` (see the module docstring). Files of
    other or dead servers get no request; a broken file or reply is one warning line."""
    lineage = set(ancestors())
    for path, info, pid in server_files(runtime_dir):
        if pid not in lineage:
            continue  # a dead server, or one that did not start this kernel: it gets nothing
        if not loopback_hosts(info):
            warn(f"the Jupyter server of {path.name} is not reachable over loopback; its token is not sent")
            continue
        url = server_url(info, pid)
        if url is None:
            continue  # the address is not this process's: whatever answers there gets nothing
        server = Server.from_info(info, url, pid)
        try:
            reply = server.request("GET", f"api/kernels/{kernel_id}")
        except (OSError, ValueError) as err:  # PolicyError is a ValueError
            warn(f"the Jupyter server of {path.name} did not confirm this kernel: {short_error(err)}")
            continue
        if isinstance(reply, dict) and reply.get("id") == kernel_id:
            return server
    return None
