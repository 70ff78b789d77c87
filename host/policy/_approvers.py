"""The approvers that ship: :class:`DenyAll`, :class:`TerminalApprover`, and
:func:`default_approver`, which picks between them.

An approver is anything that answers an :class:`~host.policy._approval.ApprovalRequest`
(``_approval.py`` defines the interface and does the asking, waiting and remembering);
these two are the defaults, one for nobody at a terminal and one for a person at it.
"""

from __future__ import annotations

import functools
import select
import sys
import threading
from typing import IO, Any

import anyio

from ._approval import Approval, ApprovalRequest, Approver, Channel

__all__ = ["DenyAll", "TerminalApprover", "default_approver"]


class DenyAll:
    """Denies every escalation: the default when nobody is at a terminal."""

    channel: Channel = "app"

    def __init__(self, note: str = "no approver is configured (nobody is at a terminal)") -> None:
        self.note = note

    def __repr__(self) -> str:
        return "<DenyAll>"

    async def decide(self, request: ApprovalRequest) -> Approval:
        del request
        return Approval(False, note=self.note)


_CHOICES: dict[str, tuple[str, Approval]] = {
    "y": ("allow once", Approval(True)),
    "s": ("allow for this session", Approval(True, "session")),
    "a": ("always allow this exact call", Approval(True, "always")),
    "t": ("always allow this tool", Approval(True, "always", "tool")),
    "n": ("deny", Approval(False)),
    "d": ("always deny this exact call", Approval(False, "always")),
}


_FULL = "f"
"""The key that shows the arguments in full."""


class TerminalApprover:
    """Asks the person at the terminal, one request at a time (the default on a tty).

    The prompt goes to stderr (or ``console``) and the answer is read from stdin (or
    ``stdin``); end of input denies. When the arguments carry warnings, an allow must be
    confirmed by typing ``yes``; a view that leaves part of the arguments out is such a
    warning, and says so above the arguments. ``f`` shows them in full, ``page_lines``
    lines (of at most ``line_chars`` characters) at a time.
    """

    channel: Channel = "terminal"

    def __init__(
        self,
        *,
        console: Any = None,
        stdin: IO[str] | None = None,
        page_lines: int = 40,
        line_chars: int = 400,
    ) -> None:
        from rich.console import Console  # only when a terminal approver is made

        self._console: Any = console if console is not None else Console(stderr=True)
        self._stdin = stdin
        self._lock: anyio.Lock | None = None
        self._page_lines = max(1, page_lines)
        self._line_chars = max(20, line_chars)

    def __repr__(self) -> str:
        return "<TerminalApprover>"

    async def decide(self, request: ApprovalRequest) -> Approval:
        if self._lock is None:
            self._lock = anyio.Lock()
        cancelled = threading.Event()
        try:
            async with self._lock:
                ask = functools.partial(self._ask, request, cancelled)
                return await anyio.to_thread.run_sync(ask, abandon_on_cancel=True)
        finally:
            # A prompt abandoned at the escalation timeout stops reading within 0.2 s,
            # so it cannot swallow the answer meant for the next prompt.
            cancelled.set()

    def _readline(self, cancelled: threading.Event | None = None) -> str | None:
        stream = self._stdin if self._stdin is not None else sys.stdin
        if stream is None:  # pyright: ignore[reportUnnecessaryComparison]
            return None
        if cancelled is not None and sys.platform != "win32":
            try:
                fd: int | None = stream.fileno()
            except (OSError, ValueError):  # not a real file (a test's StringIO)
                fd = None
            while fd is not None and not select.select([fd], [], [], 0.2)[0]:
                if cancelled.is_set():
                    return None
            if cancelled.is_set():
                return None
        line = stream.readline()
        return line if line else None

    def _ask(self, request: ApprovalRequest, cancelled: threading.Event | None = None) -> Approval:
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        head = Table.grid(padding=(0, 2))
        head.add_column(style="bold")
        head.add_column()
        head.add_row("tool", Text(request.tool))
        head.add_row("caller", Text(f"{request.caller}   session {request.session_id}"))
        if request.chain:  # a nested call: who started it, and each tool in between
            head.add_row("via", Text(" → ".join((*request.chain, request.tool))))
        head.add_row("rule", Text(request.rule))
        if request.reason:
            head.add_row("why", Text(request.reason))
        head.add_row("waits", Text(f"{request.timeout:g} s, then the call is denied"))
        body = Table.grid()
        if request.elided:
            body.add_row(
                Text(
                    f"NOT EVERYTHING IS SHOWN BELOW: press {_FULL} to see all the arguments",
                    style="bold reverse red",
                )
            )
        body.add_row(head)
        body.add_row(Text("\narguments, exactly as the tool will receive them:", style="bold"))
        body.add_row(Text(request.rendered))
        if request.warnings:
            body.add_row(Text("\nwarnings:", style="bold red"))
            for warning in request.warnings:
                body.add_row(Text(f"  ! {warning}", style="red"))
        console = self._console
        console.print(Panel(body, title="approval needed", border_style="yellow"))
        menu = "  ".join(f"[{key}] {label}" for key, (label, _) in _CHOICES.items())
        menu += f"  [{_FULL}] show the arguments in full"
        while True:
            console.print(Text(menu))
            console.print(Text("answer: "), end="")
            line = self._readline(cancelled)
            if cancelled is not None and cancelled.is_set():
                console.print(Text("(no answer in time: denied)"))
                return Approval(False, note="no answer in time")
            if line is None:
                console.print(Text("(no input: denied)"))
                return Approval(False, note="the terminal closed")
            key = line.strip().lower()[:1]
            if key == _FULL:
                self._show_full(request, cancelled)
                continue
            choice = _CHOICES.get(key)
            if choice is None:
                continue
            approval = choice[1]
            if approval.allow and request.warnings:
                console.print(Text("The arguments carry warnings. Type yes to allow: "), end="")
                confirm = self._readline(cancelled)
                if confirm is None or confirm.strip().lower() != "yes":
                    console.print(Text("not confirmed: denied"))
                    return Approval(False, note="an allow was not confirmed")
            return Approval(approval.allow, approval.remember, approval.scope, request.id)

    def _show_full(self, request: ApprovalRequest, cancelled: threading.Event | None) -> None:
        """Page the full arguments: Enter for the next page, ``q`` back to the answer."""
        from rich.text import Text

        console = self._console
        console.print(Text(f"all the arguments of {request.tool} ({request.size:,} bytes):"))
        width = self._line_chars
        shown = 0
        for line in request.full_text().splitlines():
            # A long line is cut into pieces, each marked as the rest of the one before.
            pieces = [line[i : i + width] for i in range(0, len(line), width)] or [""]
            for n, piece in enumerate(pieces):
                if shown and shown % self._page_lines == 0:
                    console.print(Text("-- more: Enter for the next page, q to stop --"), end="")
                    answer = self._readline(cancelled)
                    if answer is None or answer.strip().lower().startswith("q"):
                        console.print(Text("(the rest is not shown)"))
                        return
                console.print(Text(("⟨…⟩ " if n else "") + piece), soft_wrap=True)
                shown += 1
        console.print(Text("-- end of the arguments --"))


def default_approver() -> Approver:
    """The terminal approver when stdin is a terminal, else deny-all."""
    stdin = sys.stdin
    try:
        interactive = stdin is not None and stdin.isatty()  # pyright: ignore[reportUnnecessaryComparison]
    except (OSError, ValueError):
        interactive = False
    return TerminalApprover() if interactive else DenyAll()
