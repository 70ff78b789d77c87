"""The weaker fallback: ``[capsules] code = "subprocess"`` runs agent code in a CPython
child with rlimits, an empty environment and no inherited descriptors.

It is the same guest and the same protocol, so the REPL behaves the same; what it does
not contain (the host's files, the network) is stated in the README, and not asserted.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from host import Host

from .test_sandbox import TOOLS

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]

POLICY = """
    version = 1
    [defaults]
    agent = "allow"

    [capsules]
    code = "subprocess"
"""


@pytest.fixture
def proj(make_project: Callable[..., Path]) -> Path:
    return make_project(tools=TOOLS, policy=POLICY)


async def test_fallback_runs_the_same_repl(proj: Path) -> None:
    async with Host.open(proj) as host:
        first = await host.run_code("x = await add(2, 3)\nprint(x)\nx * 2")
        assert first.ok and first.value == 10 and first.stdout == "5\n"
        assert first.sandbox == "subprocess"
        gathered = await host.run_code("max(await asyncio.gather(*[probe(0.2) for _ in range(3)]))")
        assert gathered.value == 3
        assert (await host.run_code("x + 1")).value == 6
        await host.reset_code()
        assert (await host.run_code("'x' in globals()")).value is False


async def test_fallback_has_no_environment_descriptors_or_processes(
    proj: Path, tmp_path: Path
) -> None:
    secret = os.environ["CANARY_SECRET"]
    held = tmp_path / "held-open.txt"
    held.write_text("x")
    code = """
import os, resource
fds = {}
for fd in os.listdir('/proc/self/fd'):
    try:
        fds[fd] = os.readlink(f'/proc/self/fd/{fd}')
    except OSError:
        pass
limits = {name: resource.getrlimit(getattr(resource, name))
          for name in ('RLIMIT_AS', 'RLIMIT_NPROC', 'RLIMIT_NOFILE', 'RLIMIT_FSIZE')}
environ = dict(os.environ)
{'environ': environ, 'fds': fds, 'limits': limits}
"""
    with held.open():
        async with Host.open(proj, limits={"code_memory": "64MiB"}) as host:
            result = await host.run_code(code)
    assert result.ok, result.error
    value = result.value
    assert secret not in repr(value)
    assert set(value["environ"]) <= {"LANG", "LC_CTYPE"}
    assert str(held) not in repr(value["fds"])
    assert len(value["fds"]) <= 6, value["fds"]
    limits = value["limits"]
    assert limits["RLIMIT_AS"][0] == 64 * 1024 * 1024 + 128 * 1024 * 1024
    assert limits["RLIMIT_NOFILE"][0] == 64
    assert limits["RLIMIT_FSIZE"][0] == 0
    assert limits["RLIMIT_NPROC"][0] == 0


async def test_fallback_limits(proj: Path) -> None:
    limits = {"code_timeout": "1s", "code_memory": "64MiB"}
    async with Host.open(proj, limits=limits) as host:
        loop = await host.run_code("while True:\n    pass")
        assert loop.error is not None and loop.error.limit == "code_timeout"
        bomb = await host.run_code("x = bytearray(1 << 30)")
        assert bomb.error is not None and bomb.error.limit == "code_memory"
        assert (await host.run_code("await add(1, 1)")).value == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and prctl")
async def test_fallback_gives_up_privileges_and_cannot_read_the_host(proj: Path) -> None:
    """The fallback child sets no_new_privs and, run by root, drops every capability, so
    it cannot read the non-dumpable host's /proc entries (with ``CAP_SYS_PTRACE`` it
    could, even as a child with an empty environment)."""
    code = """
import os
import sys
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
tried = {}
for who, pid in (('host', HOST), ('parent', os.getppid())):
    for name in ('environ', 'mem'):
        try:
            with open(f'/proc/{pid}/{name}', 'rb') as f:
                tried[who, name] = len(f.read(64))
        except OSError as exc:
            tried[who, name] = type(exc).__name__
{'no_new_privs': status['NoNewPrivs'].strip(),
 'caps': [status[k].strip() for k in ('CapEff', 'CapPrm', 'CapBnd')],
 'tried': [[*key, value] for key, value in tried.items()]}
""".replace("HOST", str(os.getpid()))
    async with Host.open(proj) as host:
        result = await host.run_code(code)
    assert result.ok, result.error
    value = result.value
    assert value["no_new_privs"] == "1"
    assert value["caps"] == ["0" * 16] * 3
    # Neither the host nor the child's parent (the host's keeper, or the host itself where
    # there is none) lets it read their memory or environment.
    assert value["tried"] == [
        [who, name, "PermissionError"] for who in ("host", "parent") for name in ("environ", "mem")
    ]
