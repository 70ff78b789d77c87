"""What a subprocess capsule keeps from the host, and what it may leave behind (section C).

C01: the environment is an allow-list; C02/C10: no process a tool starts (even one that
double-forks and ``setsid()``s away) outlives the capsule when the host closes, a call
times out or the capsule crashes; C06: the protocol pipes are never inherited.
"""

from __future__ import annotations

import os

import pytest

from host import CapsuleCrashed, Host, ToolTimeout

from .fixtures.e2e.helpers import LAB, alive, capsule_pids, policy, wait_gone, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]


# -- the environment (C01) -----------------------------------------------------------------


async def test_host_secrets_do_not_reach_the_capsule() -> None:
    secret = os.environ["CANARY_SECRET"]  # set for every test by conftest
    async with Host.open(LAB) as host:
        environ = await host.call("environ")
        raw = await host.call("proc_environ")
        started = await host.call("child_environ")
    assert "CANARY_SECRET" not in environ
    assert secret not in repr(environ)
    for seen in (raw, started):
        assert b"CANARY_SECRET" not in seen and secret.encode() not in seen


async def test_the_policy_passes_and_sets_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLHOST_E2E_PASSED", "passed-from-host")
    monkeypatch.setenv("TOOLHOST_E2E_NOT_PASSED", "stays-home")
    async with Host.open(LAB) as host:
        environ = await host.call("environ")
        raw = await host.call("proc_environ")
        started = await host.call("child_environ")
    assert environ["TOOLHOST_E2E_PASSED"] == "passed-from-host"
    assert environ["TOOLHOST_E2E_SET"] == "set-by-policy"
    assert "TOOLHOST_E2E_NOT_PASSED" not in environ
    # What the programs a tool starts get. A capsule forked from the zygote keeps the
    # zygote's (scrubbed) environment in its own /proc/PID/environ: the kernel shows the
    # one a process was exec'd with.
    assert b"TOOLHOST_E2E_PASSED=passed-from-host\0" in started
    assert b"TOOLHOST_E2E_NOT_PASSED" not in raw + started


async def test_the_environment_is_minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/opt/secret-tools/bin:" + os.environ.get("PATH", ""))
    monkeypatch.delenv("TOOLHOST_E2E_PASSED", raising=False)
    async with Host.open(LAB) as host:
        environ = await host.call("environ")
    assert environ["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    allowed = {"PATH", "HOME", "LANG", "TZ", "PYTHONIOENCODING", "TOOLHOST_E2E_SET"}
    assert set(environ) <= allowed, sorted(set(environ) - allowed)


# -- no process left behind (C02, C10, C06) ------------------------------------------------


async def _spawn_both(host: Host) -> list[int]:
    """A plain child and a double-forked, setsid() daemon; both run ``sleep 1000``."""
    plain = await host.call("spawn_sleep")
    daemon = await host.call("double_fork")
    pids = [plain, daemon, *capsule_pids(host)]
    assert all(alive(p) for p in pids)
    assert os.getsid(daemon) != os.getsid(plain), "the daemon left the capsule's session"
    return pids


async def test_closing_the_host_kills_every_descendant() -> None:
    async with Host.open(LAB) as host:
        pids = await _spawn_both(host)
    await wait_gone(pids)


async def test_closing_a_session_kills_its_descendants() -> None:
    async with Host.open(LAB) as host:
        async with host.session() as session:
            plain = await session.call("spawn_sleep")
            daemon = await session.call("double_fork")
        await wait_gone([plain, daemon])
        assert await host.call("quick") == "quick"


async def test_a_timeout_kills_every_descendant() -> None:
    async with Host.open(LAB, policy=policy("timeout")) as host:
        pids = await _spawn_both(host)
        with pytest.raises(ToolTimeout):
            await host.call("hang")
        await wait_gone(pids)
        assert await host.call("quick") == "quick"


@pytest.mark.parametrize(
    ("crash", "reasons"),
    [
        ("exit_now", {"it exited with status 1"}),
        # A forked capsule is the worker itself; a started one reports through its reaper.
        ("kill_self", {"it was killed by SIGKILL", "it exited with status 137"}),
    ],
)
async def test_a_crash_kills_every_descendant(crash: str, reasons: set[str]) -> None:
    async with Host.open(LAB) as host:
        pids = await _spawn_both(host)
        with pytest.raises(CapsuleCrashed) as info:
            await host.call(crash)
        # Why it died, not only that its output ended (that comes first, the status next).
        assert info.value.reason in reasons
        await wait_gone(pids)
        assert await host.call("quick") == "quick"


async def test_killing_the_reaper_takes_the_worker_and_its_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without Landlock, as on an older kernel: with it the tool cannot signal its reaper
    # at all (tests/adversarial/test_c_containment.py).
    monkeypatch.setenv("TOOLHOST_LANDLOCK", "0")
    async with Host.open(LAB) as host:
        pids = await _spawn_both(host)
        with pytest.raises(CapsuleCrashed) as info:
            await host.call("kill_parent")
        assert info.value.may_have_executed is True
        await wait_gone(pids)
        assert await host.call("quick") == "quick"


async def test_children_inherit_no_protocol_pipe() -> None:
    async with Host.open(LAB) as host:
        child = await host.call("spawn_sleep", keep_fds=True)

        def fds() -> dict[int, str]:
            folder = f"/proc/{child}/fd"
            found: dict[int, str] = {}
            for fd in os.listdir(folder):
                try:  # an fd the loader holds for a moment can close between list and read
                    found[int(fd)] = os.readlink(f"{folder}/{fd}")
                except FileNotFoundError:
                    continue
            return found

        # Just after exec the dynamic loader may hold a library open for a moment.
        await wait_until(lambda: sorted(fds()) == [0, 1, 2], what=f"only fds 0-2: {fds()}")
        assert os.readlink(f"/proc/{child}/fd/0") == "/dev/null"
