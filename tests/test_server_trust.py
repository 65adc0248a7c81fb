"""Where a Jupyter server's token goes: only to the server that owns this kernel.

Real loopback listeners (`servers.RecordingListener`) stand in for what may sit at a port named by a
`jpserver-*.json`: another program after the server died, a proxy, a redirect target. They record
every request, so "received nothing" is a count, not a guess. Real `jupyter_server` processes and
kernels show the whole route: a server that lists a kernel id but did not start that kernel, a
proxy in the kernel's environment, https with a self-signed certificate.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from servers import (
    JupyterEnv,
    JupyterServer,
    RecordingListener,
    assert_kernel_kept,
    await_new_kernel,
    dead_pid,
    isolated_jupyter,
    pid_alive,
    running_server,
    self_signed_cert,
    standalone_kernel,
    stop_pids,
    wait_until,
    write_server_file,
)

from tfgpu_magic.views.restarting import RESTARTING
from tfgpu_magic.jupyter import server as server_client

KERNEL_ID = str(uuid.uuid4())
POLICY_IN_FORCE = "__import__('tfgpu_magic').current_policy().cpu_devices"
PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY")
RESTART_TIMEOUT = 60.0


def lists_kernel(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """A reply as a Jupyter server gives it for a kernel it runs (and 200 to anything else)."""
    body = {"id": KERNEL_ID, "name": "python3"} if path.endswith(KERNEL_ID) else {}
    return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private runtime dir; no proxy settings and no hub token from the tester's environment."""
    directory = tmp_path / "runtime"
    directory.mkdir(mode=0o700)
    for name in (*PROXY_VARIABLES, *NO_PROXY_VARIABLES, "JUPYTERHUB_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    # The one simulated fact: this test process, which holds the listeners' sockets, stands in for the
    # server that started the kernel. Whether that pid holds the named port is checked for real.
    monkeypatch.setattr(server_client, "ancestors", lambda: [os.getpid()])
    return directory


@pytest.fixture
def live_stranger() -> Iterator[int]:
    """The pid of a live process that is not an ancestor of this one."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield process.pid
    finally:
        stop_pids([process.pid])
        process.wait(10)


# ----- which servers are asked at all -------------------------------------------------------------
def test_stale_server_file_of_a_dead_server_gets_no_request(runtime: Path, monkeypatch: pytest.MonkeyPatch):
    """A `jpserver` file whose pid is gone, naming a port where another program answers 200 and
    lists the kernel: that program receives nothing, not even the hub token."""
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-" + secrets.token_hex(8))
    with RecordingListener(lists_kernel) as squatter:
        write_server_file(runtime, dead_pid(), squatter.port, token=secrets.token_hex(8))
        write_server_file(runtime, dead_pid(), squatter.port, token="")
        assert server_client.find_server(KERNEL_ID, runtime) is None
    assert squatter.requests == []


def test_live_server_that_did_not_start_this_kernel_gets_no_request(runtime: Path, live_stranger: int):
    """A live process (not an ancestor of this kernel) whose listener lists the kernel id: no request."""
    with RecordingListener(lists_kernel) as stranger:
        write_server_file(runtime, live_stranger, stranger.port, token=secrets.token_hex(8))
        assert server_client.find_server(KERNEL_ID, runtime) is None
    assert stranger.requests == []


def test_owning_server_is_asked_once_with_its_token(runtime: Path):
    """The server that started this process (an ancestor pid) and lists the kernel is the owner:
    one GET with its token; `repr` hides the token."""
    token = secrets.token_hex(8)
    with RecordingListener(lists_kernel) as owner:
        write_server_file(runtime, os.getpid(), owner.port, token=token)
        found = server_client.find_server(KERNEL_ID, runtime)
    assert found is not None and found.pid == os.getpid() and token not in repr(found)
    assert [(r.method, r.path) for r in owner.requests] == [("GET", f"/api/kernels/{KERNEL_ID}")]
    assert owner.requests[0].headers["Authorization"] == f"token {token}"


def test_owning_server_that_does_not_list_the_kernel_is_not_the_owner(runtime: Path):
    """An ancestor server that answers 200 but not with this kernel (or 404) does not own it."""
    with RecordingListener() as owner:
        write_server_file(runtime, os.getpid(), owner.port, token=secrets.token_hex(8))
        assert server_client.find_server(KERNEL_ID, runtime) is None
    assert len(owner.requests) == 1


def test_ancestor_pid_whose_file_names_a_port_it_does_not_hold_gets_no_request(
    runtime: Path, monkeypatch: pytest.MonkeyPatch
):
    """A `jpserver` file naming a real ancestor (a reused pid, or a shell that is no Jupyter server)
    and a port some other process listens on: that listener lists the kernel, and receives nothing."""
    monkeypatch.setattr(server_client, "ancestors", lambda: [os.getppid()])
    with RecordingListener(lists_kernel) as squatter:  # held by this process, not by the ancestor
        write_server_file(runtime, os.getppid(), squatter.port, token=secrets.token_hex(8))
        assert server_client.find_server(KERNEL_ID, runtime) is None
    assert squatter.requests == []


def test_listening_addresses_tell_who_holds_which_address():
    """The socket check itself: this process holds its listeners' exact addresses; its parent none."""
    with RecordingListener(lists_kernel) as v4, RecordingListener(lists_kernel, host="::1") as v6:
        assert server_client.listening_addresses(os.getpid(), v4.port) == {"127.0.0.1"}
        assert server_client.listening_addresses(os.getpid(), v6.port) == {"::1"}
        assert server_client.listening_addresses(os.getppid(), v4.port) == set()


@pytest.mark.parametrize("source", ["sock_diag", "/proc/net/tcp"])
def test_listening_addresses_from_either_source(source: str, monkeypatch: pytest.MonkeyPatch):
    """The same answers whether the kernel is asked through netlink or /proc/net/tcp{,6} is read (the
    fallback where netlink is refused): exact addresses, the wildcard, and only the IP versions asked."""
    if source != "sock_diag":
        monkeypatch.setattr(server_client, "_diag_listening", lambda version: (_ for _ in ()).throw(OSError("refused")))
    with RecordingListener(lists_kernel) as v4, RecordingListener(lists_kernel, host="::1") as v6, \
            RecordingListener(lists_kernel, host="0.0.0.0") as anywhere:  # noqa: S104
        assert server_client.listening_addresses(os.getpid(), v4.port) == {"127.0.0.1"}
        assert server_client.listening_addresses(os.getpid(), v6.port) == {"::1"}
        assert server_client.listening_addresses(os.getpid(), v6.port, (4,)) == set()
        assert server_client.listening_addresses(os.getpid(), anywhere.port, (4,)) == {"0.0.0.0"}


def test_sock_diag_lists_what_proc_net_tcp_lists():
    """Netlink's dump of listening sockets equals the /proc tables' listening rows, sockets of this
    test among them; skipped where netlink is refused (then only the tables are read)."""
    with RecordingListener(lists_kernel) as v4, RecordingListener(lists_kernel, host="::1") as v6:
        try:
            asked = sorted(server_client._diag_listening(4) + server_client._diag_listening(6))
        except OSError as err:
            pytest.skip(f"netlink sock_diag refused here: {err}")
        read = sorted(server_client._table_listening(server_client.TCP_TABLES[4])
                      + server_client._table_listening(server_client.TCP_TABLES[6]))
        assert {("127.0.0.1", v4.port), ("::1", v6.port)} <= {(address, port) for address, port, _ in asked}
    assert asked == read


def test_owner_host_needs_the_exact_address_or_its_own_wildcard():
    """127.0.0.1 is vouched for by 127.0.0.1 or 0.0.0.0 only; an IPv6 wildcard may be IPv6-only."""
    both = ["127.0.0.1", "::1"]
    assert server_client.owner_host(both, {"127.0.0.1"}) == "127.0.0.1"
    assert server_client.owner_host(both, {"0.0.0.0"}) == "127.0.0.1"
    assert server_client.owner_host(both, {"::1"}) == "::1"
    assert server_client.owner_host(both, {"::"}) == "::1"
    assert server_client.owner_host(["127.0.0.1"], {"::", "::1"}) is None
    assert server_client.owner_host(both, set()) is None


STRANGER = """
import http.server, json, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[2], "a") as log:
            log.write(json.dumps(dict(self.headers.items())) + "\\n")
        body = json.dumps({"id": sys.argv[3]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
    def log_message(self, *args): pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("listening", flush=True)
server.serve_forever()
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv for a second uid")
def test_another_uid_on_127_0_0_1_gets_nothing_when_the_owner_is_on_ipv6_only(runtime: Path, tmp_path: Path):
    """The owning server listens on [::1]:P only and its file says `localhost`; another uid listens on
    127.0.0.1:P. Every route that sends the token (restart's `find_server`, `who`'s sessions and its
    shutdown through them) asks [::1] and the other uid receives nothing."""
    from tfgpu_magic.jupyter import sessions

    def server_of_the_kernel(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        if path.rstrip("/").endswith("api/kernels"):
            return 200, {"Content-Type": "application/json"}, json.dumps([{"id": KERNEL_ID}]).encode()
        return lists_kernel(method, path)

    token = secrets.token_hex(16)
    with RecordingListener(server_of_the_kernel, host="::1") as owner:
        log = tmp_path / "stranger.log"
        log.touch()
        log.chmod(0o666)
        tmp_path.chmod(0o755)
        stranger = subprocess.Popen(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", STRANGER,
             str(owner.port), str(log), KERNEL_ID],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert stranger.stdout is not None and stranger.stdout.readline().strip() == "listening"
            write_server_file(runtime, os.getpid(), owner.port, token, hostname="localhost")
            server = server_client.find_server(KERNEL_ID, runtime)
            assert server is not None and server.url == f"http://[::1]:{owner.port}/"
            found = sessions.kernel_sessions(runtime)
            assert KERNEL_ID in found and found[KERNEL_ID].server.url == server.url
        finally:
            stop_pids([stranger.pid])
            stranger.wait(10)
        assert log.read_text() == ""
        assert owner.carrying(token)


def test_a_server_running_as_init_is_an_ancestor():
    """In a container whose entrypoint is the Jupyter server (pid 1) and whose kernels start through a
    wrapper (`sh -c`), pid 1 is among the kernel's ancestors: a fresh pid namespace shows it."""
    probe = "from tfgpu_magic.jupyter.server import ancestors; print(ancestors())"
    script = f"import subprocess, sys; subprocess.run(['sh', '-c', {sys.executable!r} + ' -c \"{probe}\"; true'])"
    try:
        done = subprocess.run(["unshare", "-pf", "--mount-proc", sys.executable, "-c", script],
                              capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("unshare is not installed")
    if done.returncode != 0 or not done.stdout.strip():
        pytest.skip(f"no new pid namespace here: {done.stderr.strip()[:200]}")
    assert 1 in json.loads(done.stdout.strip().splitlines()[-1])


# ----- proxies and redirects ----------------------------------------------------------------------
def test_proxy_in_the_environment_receives_nothing(runtime: Path, monkeypatch: pytest.MonkeyPatch):
    """`http_proxy` set, no `no_proxy`, and urllib's default opener already built with that proxy:
    the proxy gets no request, the server gets its request directly."""
    import urllib.request

    token = secrets.token_hex(8)
    with RecordingListener() as proxy, RecordingListener(lists_kernel) as owner:
        for name in PROXY_VARIABLES:
            monkeypatch.setenv(name, proxy.url)
        urllib.request.install_opener(None)
        with contextlib.suppress(OSError):  # builds and caches the default opener, proxy included
            urllib.request.urlopen("http://127.0.0.1:9/", timeout=2)  # noqa: S310
        proxy.requests.clear()
        write_server_file(runtime, os.getpid(), owner.port, token=token)
        found = server_client.find_server(KERNEL_ID, runtime)
        found_post = found.request("POST", f"api/kernels/{KERNEL_ID}/restart") if found else None
        urllib.request.install_opener(None)
    assert found is not None and found_post == {}
    assert proxy.requests == []
    assert [r.method for r in owner.carrying(token)] == ["GET", "POST"]


def test_redirect_is_not_followed_with_the_token(runtime: Path, capsys: pytest.CaptureFixture[str]):
    """The owner answering 302 to another port: the redirect target gets no request (so no token);
    one warning line, no server found."""
    token = secrets.token_hex(8)
    with RecordingListener(lists_kernel) as target:

        def redirect(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
            return 302, {"Location": target.url.rstrip("/") + path}, b""

        with RecordingListener(redirect) as owner:
            write_server_file(runtime, os.getpid(), owner.port, token=token)
            assert server_client.find_server(KERNEL_ID, runtime) is None
    assert target.requests == [] and len(owner.requests) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "302" in lines[0] and token not in lines[0], lines


# ----- hosts: loopback only -------------------------------------------------------------------------
def test_wildcard_server_is_reached_over_loopback(runtime: Path):
    """A server listening on every interface (`--ip=0.0.0.0`, its URL naming the machine) is asked at
    127.0.0.1 on its port, never at the host name in its URL."""
    with RecordingListener(lists_kernel) as owner:
        write_server_file(
            runtime, os.getpid(), owner.port, token="t", hostname="0.0.0.0", url=f"http://example.invalid:{owner.port}/"
        )
        found = server_client.find_server(KERNEL_ID, runtime)
    assert found is not None and found.url == f"http://127.0.0.1:{owner.port}/"
    assert len(owner.requests) == 1


@pytest.mark.parametrize("host", ["192.0.2.7", "example.invalid", "10.0.0.1"])
def test_remote_server_never_gets_the_token(runtime: Path, host: str, capsys: pytest.CaptureFixture[str]):
    """A server on a remote or LAN address (even one this kernel's ancestor) gets no request: the
    file's `url` (here pointing at a recording listener) is not used, and nothing is tried over the
    network (no connect timeout); one warning line."""
    with RecordingListener(lists_kernel) as listener:
        write_server_file(runtime, os.getpid(), listener.port, token="t", hostname=host, url=listener.url)
        started = time.monotonic()
        assert server_client.find_server(KERNEL_ID, runtime) is None
        assert time.monotonic() - started < 1.0
    assert listener.requests == []
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "loopback" in lines[0], lines


def test_loopback_rules():
    """What `loopback_hosts` accepts: loopback addresses and the wildcards, nothing else; `server_url`
    builds the URL at the address the owner holds."""
    info = {"port": 8888, "base_url": "/lab/", "secure": False}
    assert server_client.loopback_hosts({**info, "hostname": "127.0.0.1"}) == ["127.0.0.1"]
    assert server_client.loopback_hosts({**info, "hostname": "localhost"}) == ["127.0.0.1", "::1"]
    assert server_client.loopback_hosts({**info, "hostname": "::"}) == ["::1", "127.0.0.1"]
    assert server_client.loopback_hosts({**info, "hostname": "::1"}) == ["::1"]
    for bad in ({"hostname": "8.8.8.8"}, {"hostname": "127.0.0.1", "port": "8888"}, {"hostname": "127.0.0.1", "port": True},
                {"hostname": "127.0.0.1", "sock": "/tmp/s"}, {"hostname": "127.0.0.1", "base_url": "http://x/"},
                {"hostname": ["127.0.0.1"]}, {"hostname": "localhost.example"}):  # fmt: skip
        assert server_client.loopback_hosts({**info, **bad}) == [], bad
    with RecordingListener(lists_kernel, host="::1") as v6:
        info = {**info, "port": v6.port, "hostname": "localhost", "secure": True}
        assert server_client.server_url(info, os.getpid()) == f"https://[::1]:{v6.port}/lab/"
        assert server_client.server_url({**info, "hostname": "127.0.0.1"}, os.getpid()) is None


# ----- real servers and kernels -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def proxy() -> Iterator[RecordingListener]:
    with RecordingListener() as listener:
        yield listener


@pytest.fixture(scope="module")
def server(proxy: RecordingListener) -> Iterator[JupyterServer]:
    """A real server whose kernels have `http_proxy` (and friends) pointing at a recording proxy."""
    with isolated_jupyter("tfgpu-trust-") as env:
        env.environ.update({name: proxy.url for name in PROXY_VARIABLES})
        for name in NO_PROXY_VARIABLES:
            env.environ.pop(name, None)
        with running_server(env) as running:
            yield running


def test_server_route_ignores_the_kernels_proxy(server: JupyterServer, proxy: RecordingListener):
    """A server kernel with `http_proxy` set restarts through its server and has the policy in force;
    the proxy received nothing."""
    assert_restarts_into_policy(server, 2)
    assert proxy.requests == []


def assert_restarts_into_policy(server: JupyterServer, cpus: int) -> None:
    """A kernel of `server` given `split cpu {cpus}` and `restart --yes` is restarted by the server
    and has the policy in force."""
    with server.kernel() as kernel:
        old_pid = kernel.pid()
        output = kernel.ok(f"%load_ext tfgpu_magic\n%tfgpu split cpu {cpus}\n%tfgpu restart --yes").output
        assert RESTARTING in output, output
        new = await_new_kernel(kernel, old_pid, RESTART_TIMEOUT)
        try:
            assert wait_until(lambda: new.evaluate(POLICY_IN_FORCE) == cpus, 30, "policy in force")
        finally:
            new.close()


def test_server_listing_the_kernel_but_not_its_parent_gets_no_post(server: JupyterServer, proxy: RecordingListener):
    """A kernel started by a plain manager on a connection file named `kernel-<X>.json` (elsewhere),
    where X is a kernel of a live server in the same runtime dir: that server lists X but did not
    start this kernel, so it is not asked (no restart of X, no token sent); this kernel is told to
    restart from its front end and keeps running."""
    with server.kernel() as owned:
        owned_pid = owned.pid()
        elsewhere = server.env.root / "elsewhere"
        elsewhere.mkdir(exist_ok=True)
        with standalone_kernel(server.env, connection_file=elsewhere / f"kernel-{owned.kernel_id}.json") as kernel:
            pid = kernel.pid()
            result = kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu restart --yes")
            assert "Not restarted" in result.stdout and RESTARTING not in result.stdout, result.output
            assert_kernel_kept(kernel, pid)
        assert owned.pid() == owned_pid and pid_alive(owned_pid)
    assert proxy.requests == []




@pytest.fixture(scope="module")
def https_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    certificate = self_signed_cert(tmp_path_factory.mktemp("cert"))
    if certificate is None:
        pytest.skip("no `openssl` command to make a self-signed certificate")
    with isolated_jupyter("tfgpu-https-") as env, running_server(env, certificate=certificate) as running:
        yield running


def test_https_server_with_self_signed_certificate_restarts(https_server: JupyterServer):
    """A server on https://127.0.0.1 with a self-signed certificate owns its kernel (not "no
    server"): `restart --yes` restarts through it and the policy is in force."""
    env: JupyterEnv = https_server.env
    assert json.loads(next(env.runtime_dir.glob("jpserver-*.json")).read_text())["secure"] is True
    assert_restarts_into_policy(https_server, 3)


def test_refused_restart_is_said_in_the_next_cell(tmp_path: Path):
    """The owner (here a listener in this test process, which is the kernel's parent, answering for
    the kernel id of its connection file) confirms the kernel, then refuses the POST with 403: the
    kernel lives on, and the next cell starts with one clear line that it was NOT restarted."""
    with isolated_jupyter("tfgpu-refused-") as env:
        kernel_id = str(uuid.uuid4())

        def owner_refusing(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
            if method == "POST":
                return 403, {"Content-Type": "application/json"}, b'{"message": "Forbidden"}'
            return 200, {"Content-Type": "application/json"}, json.dumps({"id": kernel_id}).encode()

        token = secrets.token_hex(8)
        with RecordingListener(owner_refusing) as owner, standalone_kernel(
            env, connection_file=env.runtime_dir / f"kernel-{kernel_id}.json"
        ) as kernel:
            write_server_file(env.runtime_dir, os.getpid(), owner.port, token=token)
            pid = kernel.pid()
            said = kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu restart --yes").stdout
            assert RESTARTING in said and "as this cell ends" in said, said
            wait_until(lambda: [r.method for r in owner.requests] == ["GET", "POST"], 10, "the restart asked")
            assert_kernel_kept(kernel, pid)
            next_cell = kernel.ok("pass")
            lines = [line for line in next_cell.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and "NOT restarted" in lines[0] and "403" in lines[0], next_cell.output
            assert token not in next_cell.output
        assert len(owner.carrying(token)) == 2
