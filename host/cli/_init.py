"""``toolhost init [DIR]``: a new project a user can run at once.

It writes a ``src/tools/`` layout with two small tool files, a commented ``policy.toml``
(allow, deny and escalate, with argument conditions), an example hook in ``src/hooks/``
(hooks live beside the tools folder), a ``.gitignore``
for the state folder and a short README. It never overwrites: when any of its files is
already there it writes nothing and names them. The files are this module's text, not
files of the package, so an installed wheel carries them with the code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

from ._common import Subparsers, UsageError, dumps

__all__ = ["INIT_COMMANDS", "PROJECT_FILES"]

_NOTES: Final = '''\
"""A small notebook. The notes are module state: they live as long as the session."""

from typing import TypedDict


class Note(TypedDict):
    """One note as it was written."""

    id: int
    text: str


_notes: dict[int, Note] = {}


def add(text: str) -> Note:
    """Write a note; returns it with its id."""
    note: Note = {"id": max(_notes, default=0) + 1, "text": text}
    _notes[note["id"]] = note
    return note


def find(word: str = "") -> list[Note]:
    """The notes whose text contains ``word``, ignoring case (every note when empty)."""
    return [note for note in _notes.values() if word.lower() in note["text"].lower()]


def remove(note_id: int) -> bool:
    """Delete a note; True when there was one with that id."""
    return _notes.pop(note_id, None) is not None
'''

_TEXT: Final = '''\
"""Text helpers. A sync function is a tool too: callers still await it."""


def word_count(text: str) -> int:
    """How many words ``text`` has (runs of non-space characters)."""
    return len(text.split())
'''

_POLICY: Final = """\
# Who may call which tool. Every rule that matches a call counts: deny beats escalate,
# escalate beats allow, and [defaults] decides when no rule matches.
#   toolhost policy check TOOL [ARG ...] --caller agent   the decision for one call, and why
#   toolhost policy lint                                   rules that change nothing
# The host reads this file again when it changes; the audit records which version decided.
version = 1

[defaults]                      # when no rule matches, per caller
agent = "deny"                  # code the model wrote (toolhost exec, run_code over MCP)
script = "allow"                # trusted scripts (toolhost run)
app = "allow"                   # your app, and toolhost call
tool = "deny"                   # a tool calling another tool through its context
escalation_timeout = "120s"     # an escalation nobody answers is denied after this

# allow: reading and counting are harmless.
[[rules]]
id = "read"
tools = ["find", "word_count"]
decision = "allow"

# allow, with a condition on an argument (by parameter name): short notes.
# A regex must match the whole value; (?s) lets `.` match a newline too.
[[rules]]
id = "short-notes"
tools = ["add"]
when.text = { regex = "(?s).{1,200}" }
decision = "allow"

# escalate: a long note waits for a person (the terminal, the approval inbox, or the
# MCP client) to say yes; without an answer in time it is denied.
[[rules]]
id = "long-notes"
tools = ["add"]
when.text = { regex = "(?s).{201,}" }
decision = "escalate"
reason = "A long note may be pasted data; have a look first."

# escalate for one caller: the model's code may delete only with a person's yes.
[[rules]]
id = "agent-removes"
tools = ["remove"]
callers = ["agent"]
decision = "escalate"
reason = "Deleting a note cannot be undone."

# deny: a note that looks like it holds a password is refused for everyone
# (deny beats the allow above). (?i) ignores case.
[[rules]]
id = "no-passwords"
tools = ["add"]
when.text = { regex = "(?is).*pass(word|wd).*" }
decision = "deny"
reason = "Keep passwords out of notes."

[limits]                        # read when the host starts
call_timeout = "30s"
"""

_HOOK: Final = '''\
"""An example hook: trusted project code, run in the host around every call (never in
a capsule). ``toolhost hooks`` lists the hooks in the order they run.

This one keeps email addresses out of the notes that the model's code reads: for
the caller ``agent``, ``find`` returns ``<email>`` in their place. Other callers see
the notes as written.
"""

from __future__ import annotations

import re
from typing import Any

from host.hooks import HookContext, ToolCallInfo, ToolResult, hook

_EMAIL = re.compile(r"[\\w.+-]+@[\\w-]+(?:\\.[\\w-]+)+")


@hook("after_tool_call_success", id="hide-emails-from-agents")
def hide_emails(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
    """``find``'s notes with each email address replaced, for the model's code."""
    if call.tool != "find" or ctx.caller != "agent":
        return None  # None keeps the result as it is
    return [
        {**note, "text": _EMAIL.sub("<email>", note["text"])} for note in result.value
    ]
'''

_GITIGNORE: Final = """\
# toolhost's state: the audit trail, grants, generated declarations
.agent/
__pycache__/
"""

_README: Final = """\
# {name}

A [toolhost](https://pypi.org/project/toolhost/) project: plain Python tools, a policy
that decides who may call them, and a hook.

```
src/tools/notes.py    add, find, remove: a notebook kept in the capsule for the session
src/tools/text.py     word_count
src/hooks/            code run in the host around every call (hooks live beside tools/)
policy.toml           who may call what (allow, escalate, deny)
.agent/               state toolhost writes (audit trail, grants); not for git
```

Try it from this folder:

```bash
toolhost call add "buy milk"                      # your app's call: allowed
toolhost exec -c 'await add("call Ada"); print(await find("ada"))'   # the model's code
toolhost policy check remove 1 --caller agent     # escalate (rule agent-removes)
toolhost call add "my password is hunter2"        # denied (rule no-passwords)
toolhost scope                                    # what the model is told it can call
toolhost hooks                                    # the hooks, in the order they run
toolhost audit                                    # every decision, oldest first
toolhost serve                                    # the tools over MCP (stdio)
```

Add a tool: write a function with type hints and a docstring in `src/tools/`. It is
exported by its name; files starting with `_` are private helpers. Then give it a rule in
`policy.toml` (the model's code may call only what a rule allows) and run
`toolhost policy lint`.
"""

PROJECT_FILES: Final[dict[str, str]] = {
    "src/tools/notes.py": _NOTES,
    "src/tools/text.py": _TEXT,
    "policy.toml": _POLICY,
    "src/hooks/hide_emails.py": _HOOK,
    ".gitignore": _GITIGNORE,
    "README.md": _README,
}
"""The files ``toolhost init`` writes, by path in the project; ``{name}`` in the README is
the project folder's name."""


def write_project(folder: Path) -> list[Path]:
    """Write a new project into ``folder`` (made if missing); the files written.

    Raises :class:`UsageError`, writing nothing, when any of the files exists already.
    """
    folder = folder.expanduser()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} exists and is not a folder")
    taken = sorted(path for path in PROJECT_FILES if (folder / path).exists())
    if taken:
        raise UsageError(
            f"{folder} already has {', '.join(taken)}: toolhost init never overwrites; "
            "move them away or pick another folder"
        )
    written: list[Path] = []
    for relative, text in PROJECT_FILES.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if relative == "README.md":
            text = text.format(name=folder.resolve().name)
        with path.open("x", encoding="utf-8") as file:  # "x": never replace a file
            file.write(text)
        written.append(path)
    return written


async def _init(args: argparse.Namespace) -> int:
    return _init_now(args)  # a few small files: no reason to leave the loop


def _init_now(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    written = write_project(folder)
    if args.json:
        files = [path.relative_to(folder).as_posix() for path in written]
        print(dumps({"ok": True, "project": str(folder.resolve()), "files": files}))
        return 0
    for path in written:
        print(f"wrote {path}")
    where = "" if folder.resolve() == Path.cwd().resolve() else f"cd {args.dir} && "
    print(
        f"\nnext: {where}toolhost call add 'buy milk'   (its README shows more)",
        file=sys.stderr,
    )
    return 0


def _add_init(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    del common  # init makes a project: --project names one that exists
    parser = sub.add_parser(
        "init",
        help="start a new project: tools, a policy, a hook",
        description="Write a new project into DIR (default: here): src/tools/ with two "
        "example tool files, a commented policy.toml, src/hooks/, .gitignore and a README. "
        "Existing files are never overwritten.",
    )
    parser.add_argument("dir", nargs="?", default=".", metavar="DIR")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.set_defaults(handler=_init)


INIT_COMMANDS = [_add_init]
"""The sub-commands this module adds to ``toolhost``."""
