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


def test_a_port_out_of_range_is_a_policy_error(tmp_path: Path) -> None:
    from host import PolicyFileError, load_policy

    path = tmp_path / "policy.toml"
    path.write_text(textwrap.dedent(policy("[0, 70000]")))
    with pytest.raises(PolicyFileError) as info:
        load_policy([path])
    assert "network" in str(info.value)
