"""Section C for the labelled code-mode fallback (``[capsules] code = "subprocess"``):
agent code that forks, ``setsid()``\\ s away and leaves a daemon behind.

``RLIMIT_NPROC`` 0 stops an unprivileged host's agent code from forking at all, but does
not bind root. Run as root, the daemon's parent exits at once, and it would be re-parented
to init and outlive the session and the host: the fallback's child is started by the host's
keeper (a child subreaper), which adopts such orphans and kills them. Whatever ends the
run afterwards, a close or ``SIGKILL`` of the host, nothing of the agent code's lineage
remains.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest

from host.capsules._keeper_child import _TICK_MS

from .contain_helpers import Lab, account, accounts, alive, lab, marked, wait_gone, wait_until

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes"),
]
__all__ = ["account", "accounts", "lab"]  # the fixtures, used here

POLICY = """
    version = 1

    [defaults]
    agent = "allow"

    [capsules]
    code = "subprocess"
"""

KEEPER_SWEEP = _TICK_MS / 1000
"""How often the keeper looks for adopted processes, in seconds."""

TOOLS = {"desk": "def quick() -> str:\n    return 'quick'\n"}

CODE = """
import os, sys
try:
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid()
            mark = %r + %r  # the token, which the host's own command line must not hold
            nap = "import time\\nwhile True: time.sleep(0.05)"
            os.execv(sys.executable, [sys.executable, "-c", nap, mark])
        os._exit(0)
    os.wait()
    outcome = "forked"
except OSError as exc:
    outcome = type(exc).__name__
outcome
"""

SCRIPT = """
    async def main():
        _, code = ARGS
        async with Host.open(PROJECT) as host:
            out = await host.run_code(code)
            say(host=os.getpid(), value=out.value, error=out.error and out.error.message)
            await ask()
            out = await host.run_code("await quick()")
            say(quick=out.value if out.error is None else out.error.message)
            await ask()
        say(closed=True)

    anyio.run(main)
"""


@pytest.mark.parametrize("end", ["close", "sigkill"])
def test_agent_code_that_leaves_a_daemon_leaves_nothing_running(lab: Lab, end: str) -> None:
    token = lab.token("fallback")
    project = lab.project(TOOLS, policy=POLICY)
    run = lab.run(SCRIPT, project, "-", CODE % (token[:9], token[9:]))
    first = run.report()
    lab.own(first["host"])
    if not lab.account.root:
        # RLIMIT_NPROC binds every user but root: the code cannot fork at all.
        assert first["value"] in ("BlockingIOError", "PermissionError"), first
    else:
        assert first["value"] == "forked", first
        # The orphan came back to the keeper, which kills what it adopts on its next sweep
        # (no signal tells a subreaper of an adoption): past one sweep, it is gone for
        # good. The daemon may exec (and bear the token) only after the run returned, so
        # a look before the sweep proves nothing.
        time.sleep(KEEPER_SWEEP + 0.5)
        wait_gone([], token, timeout=KEEPER_SWEEP + 1)
    assert marked(token) == []
    run.send("look")
    assert run.report() == {"quick": "quick"}  # the sandbox still serves
    if end == "close":
        run.send("close")
        assert run.report() == {"closed": True}
        assert run.wait() == 0
    else:
        run.kill()
        assert run.wait() == -signal.SIGKILL
    wait_until(lambda: not alive(first["host"]), "the host to end")
    wait_gone([], token)
