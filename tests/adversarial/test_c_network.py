"""C. Tool capsules have no network unless the policy grants it.

A tool that can open TCP connections to loopback can reach the approval inbox (and
replay a cookie it collected on another port: cookies ignore ports), or any local
service. By default a subprocess tool capsule may neither connect nor listen over TCP,
to loopback, to the inbox's port or to an outside address (Landlock ABI 4: Linux 6.7);
``[capsules] network`` names the ports it may connect to, or ``"all"``.
"""

from __future__ import annotations

import socket
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from capsule import _landlock
from host import Host

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]

TOOLS = {
    "net": """
        import errno
        import socket


        def connect(host: str, port: int) -> str:
            try:
                with socket.create_connection((host, port), timeout=2):
                    return "connected"
            except OSError as exc:
                return errno.errorcode.get(exc.errno or 0, str(exc))


        def listen() -> str:
            try:
                with socket.create_server(("127.0.0.1", 0)):
                    return "listening"
            except OSError as exc:
                return errno.errorcode.get(exc.errno or 0, str(exc))


        def datagram(host: str, port: int, text: str) -> str:
            # UDP, which Landlock does not filter (a DNS query out, say).
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                    sock.sendto(text.encode(), (host, port))
                    return "sent"
            except OSError as exc:
                return errno.errorcode.get(exc.errno or 0, str(exc))


        def namespace() -> str:
            import os

            return os.readlink("/proc/self/ns/net")


        def through_proxy(target: str, text: str) -> str:
            # What an HTTP client does with HTTPS_PROXY: CONNECT, then talk in the tunnel.
            import os
            from urllib.parse import urlsplit

            proxy = urlsplit(os.environ["HTTPS_PROXY"])
            try:
                with socket.create_connection((proxy.hostname, proxy.port), timeout=5) as s:
                    s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
                    head = b""
                    while b"\\r\\n\\r\\n" not in head:
                        got = s.recv(4096)
                        if not got:
                            break
                        head += got
                    status = head.split(b"\\r\\n", 1)[0].decode()
                    if " 200 " not in status:
                        return status
                    s.sendall(text.encode())
                    return s.recv(100).decode()
            except OSError as exc:
                return errno.errorcode.get(exc.errno or 0, str(exc))
    """
}


def policy(network: str | None) -> str:
    line = "" if network is None else f"[capsules]\nnetwork = {network}\n"
    return 'version = 1\n[defaults]\napp = "allow"\n' + line


@pytest.fixture
def server() -> Iterator[int]:
    """A loopback port something listens on (it stands for the inbox, or any service)."""
    if _landlock.abi() < _landlock.NET_ABI:
        pytest.skip(f"this kernel's Landlock (ABI {_landlock.abi()}) has no network rules")
    with socket.create_server(("127.0.0.1", 0)) as listening:
        yield listening.getsockname()[1]


async def test_no_network_by_default(make_project: Callable[..., Path], server: int) -> None:
    project = make_project(TOOLS, policy(None))
    async with Host.open(project) as host:
        assert await host.call("connect", "127.0.0.1", server) == "EACCES"
        assert await host.call("connect", "localhost", server) == "EACCES"
        assert await host.call("connect", "10.255.255.1", 80) == "EACCES"  # outside
        assert await host.call("listen") == "EACCES"
        async with host.session() as other:  # a forked capsule of another session too
            assert await other.call("connect", "127.0.0.1", server) == "EACCES"


async def test_the_policy_names_the_ports_tools_may_connect_to(
    make_project: Callable[..., Path], server: int
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as other_listening:
        other = other_listening.getsockname()[1]
        project = make_project(TOOLS, policy(f"[{server}]"))
        async with Host.open(project) as host:
            assert await host.call("connect", "127.0.0.1", server) == "connected"
            assert await host.call("connect", "127.0.0.1", other) == "EACCES"
            assert await host.call("listen") == "EACCES"


async def test_all_leaves_tcp_as_it_is(make_project: Callable[..., Path], server: int) -> None:
    project = make_project(TOOLS, policy('"all"'))
    async with Host.open(project) as host:
        assert await host.call("connect", "127.0.0.1", server) == "connected"
        assert await host.call("listen") == "listening"


@pytest.fixture
def udp() -> Iterator[socket.socket]:
    """A loopback UDP port that counts what reaches it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listening:
        listening.bind(("127.0.0.1", 0))
        listening.settimeout(0.5)
        yield listening


def _received(listening: socket.socket) -> list[bytes]:
    got: list[bytes] = []
    try:
        while True:
            got.append(listening.recv(100))
    except TimeoutError:
        return got


async def test_no_udp_or_any_other_network_by_default(
    make_project: Callable[..., Path], udp: socket.socket
) -> None:
    """Landlock filters TCP only: the capsule's own network namespace takes the rest
    (its loopback is not the host's, and it has no route out)."""
    import os

    port = udp.getsockname()[1]
    project = make_project(TOOLS, policy(None))
    async with Host.open(project) as host:
        assert await host.call("datagram", "127.0.0.1", port, "leak") == "ENETUNREACH"
        assert await host.call("datagram", "10.255.255.1", 53, "leak") == "ENETUNREACH"
        assert await host.call("namespace") != os.readlink("/proc/self/ns/net")
        async with host.session() as other:  # a forked capsule of another session too
            assert await other.call("datagram", "127.0.0.1", port, "leak") == "ENETUNREACH"
            assert await other.call("namespace") != os.readlink("/proc/self/ns/net")
    assert _received(udp) == []


async def test_the_network_is_there_when_the_policy_gives_it(
    make_project: Callable[..., Path], udp: socket.socket
) -> None:
    """The control: the same datagram arrives from a capsule given ``"all"``, and one
    given named ports keeps the host's network (ports need it), TCP-filtered only."""
    import os

    port = udp.getsockname()[1]
    for network in ('"all"', "[9]"):
        project = make_project(TOOLS, policy(network))
        async with Host.open(project) as host:
            assert await host.call("datagram", "127.0.0.1", port, network) == "sent"
            assert await host.call("namespace") == os.readlink("/proc/self/ns/net")
    assert sorted(_received(udp)) == [b'"all"', b"[9]"]


def test_without_landlocks_tcp_rules_a_namespace_is_required(tmp_path: Path) -> None:
    """On a kernel whose Landlock has no network rules (before 6.7), the namespace is
    what takes the network away; with neither, the capsule does not load."""
    import subprocess
    import sys

    probe = textwrap.dedent(
        """
        import sys
        from capsule import _landlock
        _landlock.abi = lambda: 3  # as a 6.2 kernel
        try:
            _landlock.restrict({"network": "none", "netns_failure": "unshare: EPERM"})
        except OSError as exc:
            print("refused:", exc)
            sys.exit(0)
        print("restricted without any network rule")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.stdout.startswith("refused:"), done.stdout + done.stderr
    assert "unshare: EPERM" in done.stdout and 'network = "all"' in done.stdout


@pytest.fixture
def echo_server() -> Iterator[int]:
    """A loopback TCP port that answers what it gets, upper-cased (a named host's API)."""
    import threading

    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = listening.accept()
            except OSError:
                return
            with conn:
                data = conn.recv(100)
                conn.sendall(data.upper())

    threading.Thread(target=serve, daemon=True).start()
    yield port
    listening.close()


async def test_named_hosts_are_reached_through_the_egress_proxy_only(
    make_project: Callable[..., Path], echo_server: int, udp: socket.socket, server: int
) -> None:
    """``network = ["localhost:PORT"]``: the tool reaches that host and port through the
    host's proxy (``HTTPS_PROXY``); another name, another port, a plain HTTP request and
    a direct connection to the very same port are refused, and every tunnel and refusal
    is an event."""
    del server  # only its skip: Landlock's TCP rules are what keep the proxy unbypassed
    project = make_project(TOOLS, policy(f'["localhost:{echo_server}"]'))
    async with Host.open(project) as host:
        seen: list[Any] = []
        host.on("egress_tunnel", seen.append)
        host.on("egress_refused", seen.append)
        assert host.egress is not None
        target = f"localhost:{echo_server}"
        assert await host.call("through_proxy", target, "hello") == "HELLO"
        assert await host.call("through_proxy", f"LocalHost.:{echo_server}", "x") == "X"
        refused = await host.call("through_proxy", f"127.0.0.1:{echo_server}", "x")
        assert refused.startswith("HTTP/1.1 403"), refused  # not the name the policy gives
        other = await host.call("through_proxy", f"localhost:{echo_server + 1}", "x")
        assert other.startswith("HTTP/1.1 403"), other
        # Around the proxy: Landlock allows the proxy's port, not the named one.
        assert await host.call("connect", "127.0.0.1", echo_server) == "EACCES"
        assert await host.call("connect", "localhost", echo_server) == "EACCES"
        assert await host.call("connect", "127.0.0.1", host.egress.port) == "connected"
        for odd in (  # odd requests get an answer, and the proxy goes on serving
            "CONNECT localhost:\u00b2\u00b3 HTTP/1.1\r\n\r\n".encode("latin-1"),
            b"CONNECT localhost HTTP/1.1\r\n\r\n",
            b"\x00\xff garbage\r\n\r\n",
        ):
            async with await anyio.connect_tcp("127.0.0.1", host.egress.port) as odd_client:
                await odd_client.send(odd)
                assert (await odd_client.receive()).startswith((b"HTTP/1.1 403", b"HTTP/1.1 405"))
        assert await host.call("through_proxy", target, "again") == "AGAIN"
        async with await anyio.connect_tcp("127.0.0.1", host.egress.port) as plain:
            await plain.send(b"GET http://localhost/ HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert (await plain.receive()).startswith(b"HTTP/1.1 405")
    kinds = [(e.kind, e.data["target"]) for e in seen]
    assert kinds[:2] == [("egress_tunnel", target), ("egress_tunnel", f"localhost:{echo_server}")]
    assert ("egress_refused", f"127.0.0.1:{echo_server}") in kinds
    assert ("egress_refused", f"localhost:{echo_server + 1}") in kinds


def test_network_entries_are_checked(tmp_path: Path) -> None:
    from host import PolicyFileError, load_policy

    path = tmp_path / "policy.toml"
    for bad, said in [
        ('["a b:1"]', "neither a port nor a host and port"),
        ('["api.example.com"]', "neither a port nor a host and port"),
        ('["api.example.com:0"]', "neither a port nor a host and port"),
        ("[true]", "neither a port nor a host and port"),
        ('"some"', 'say "none", "all"'),
    ]:
        path.write_text(policy(bad))
        with pytest.raises(PolicyFileError, match=said):
            load_policy([path])
    path.write_text(policy('[5432, "API.example.com.:443"]'))
    capsules = load_policy([path]).capsules
    assert capsules.network_ports() == [5432]
    assert capsules.network_hosts() == [("api.example.com", 443)]


def test_a_port_out_of_range_is_a_policy_error(tmp_path: Path) -> None:
    from host import PolicyFileError, load_policy

    path = tmp_path / "policy.toml"
    path.write_text(textwrap.dedent(policy("[0, 70000]")))
    with pytest.raises(PolicyFileError) as info:
        load_policy([path])
    assert "network" in str(info.value)
