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


def test_a_port_out_of_range_is_a_policy_error(tmp_path: Path) -> None:
    from host import PolicyFileError, load_policy

    path = tmp_path / "policy.toml"
    path.write_text(textwrap.dedent(policy("[0, 70000]")))
    with pytest.raises(PolicyFileError) as info:
        load_policy([path])
    assert "network" in str(info.value)
