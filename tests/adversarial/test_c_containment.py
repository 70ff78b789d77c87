"""Section C (subprocess capsule containment), C02 and C10 as the attack run found them
(issue 12.1): a tool that double-forks, ``setsid()``\\ s away and then kills its own
process group took its capsule's worker and reaper with it, and its daemon, re-parented
to init, kept running after the host exited.

Each run is a real host process, as root and as an unprivileged user, with Landlock (the
group kill then spares the reaper, which cleans up) and without it (``TOOLHOST_LANDLOCK=0``:
the keeper adopts the daemon and kills it). Whatever ends the host afterwards, a close or
``SIGKILL``, no process of the capsule's lineage remains and the daemon's canary file
stops growing.
"""

from __future__ import annotations

import signal
import sys

import pytest

from .contain_helpers import Lab, account, accounts, alive, lab, marked, parent_of, wait_gone

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes"),
]
__all__ = ["account", "accounts", "lab"]  # the fixtures, used here

ESCAPE = {
    "escape": '''
        import os
        import signal
        import sys
        import time

        DAEMON = (
            "import sys, time\\n"
            "while True:\\n"
            "    with open(sys.argv[2], 'a') as f:\\n"
            "        f.write('x')\\n"
            "    time.sleep(0.02)\\n"
        )


        def escape(token: str, canary: str) -> None:
            """Fork, fork, setsid, start a daemon that keeps writing, kill our own group."""
            read, write = os.pipe()
            if os.fork() == 0:
                if os.fork() == 0:
                    os.setsid()
                    if os.fork() == 0:
                        os.write(write, str(os.getpid()).encode())
                        mark = token + ":daemon"  # what the test looks for
                        os.execv(sys.executable, [sys.executable, "-c", DAEMON, mark, canary])
                    os._exit(0)
                os._exit(0)
            os.close(write)
            os.wait()
            os.read(read, 32)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # until the daemon has written once
                if os.path.exists(canary) and os.path.getsize(canary):
                    break
                time.sleep(0.01)
            os.killpg(0, signal.SIGKILL)
            time.sleep(60)


        def quick() -> str:
            return "quick"
    ''',
}

SCRIPT = """
    async def main():
        token, canary = ARGS
        async with Host.open(PROJECT) as host:
            capsule = host.default_session.supervisor.transport
            say(host=os.getpid(), reaper=capsule.pid, worker=capsule.report.pid)
            try:
                await host.call("escape", token, canary)
            except CapsuleCrashed as exc:
                say(crashed=exc.reason)
            else:
                say(crashed=None)
            await ask()
            value = await host.call("quick")
            capsule = host.default_session.supervisor.transport
            say(quick=value, reaper=capsule.pid, worker=capsule.report.pid)
            await ask()
        say(closed=True)

    anyio.run(main)
"""


@pytest.mark.parametrize("landlock", ["on", "off"])
@pytest.mark.parametrize("end", ["close", "sigkill"])
def test_a_tool_that_kills_its_own_process_group_leaves_nothing_running(
    lab: Lab, landlock: str, end: str
) -> None:
    token = lab.token("escape")
    daemon = token + ":daemon"
    project = lab.project(ESCAPE, folders=["out"])
    canary = project / "out" / "canary"
    env = lab.env(**({"TOOLHOST_LANDLOCK": "0"} if landlock == "off" else {}))
    run = lab.run(SCRIPT, project, token, str(canary), env=env)
    first = run.report()
    starter = parent_of(first["reaper"])  # the host's keeper (the host where there is none)
    lab.own(starter, first["reaper"], first["worker"])
    assert parent_of(starter) == first["host"]
    assert run.report()["crashed"], "the tool's call should end with its capsule"
    assert canary.stat().st_size > 0, "the daemon ran"
    # The daemon is gone while the host still runs, and the capsule with it.
    wait_gone([first["reaper"], first["worker"]], daemon)
    assert alive(first["host"])
    run.send("look")
    second = run.report()
    assert second["quick"] == "quick"  # a fresh capsule serves the next call
    starters = {starter, parent_of(second["reaper"])} - {first["host"]}
    lab.own(*starters, second["reaper"], second["worker"])
    if end == "close":
        run.send("close")
        assert run.report() == {"closed": True}
        assert run.wait() == 0
    else:
        run.kill()
        assert run.wait() == -signal.SIGKILL
    wait_gone([*starters, second["reaper"], second["worker"]], daemon)
    size = canary.stat().st_size
    assert not marked(daemon)
    assert canary.stat().st_size == size, "tool code still runs"
