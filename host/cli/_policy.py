"""``toolhost policy check``, ``toolhost policy grants`` and ``toolhost audit``.

``policy check`` binds the arguments and asks the policy files, exactly as a call would,
and prints the decision and the rule that made it; nothing runs and no capsule starts.
``policy grants`` lists the remembered "always" answers and revokes one; ``audit``
prints the last records of the audit trail. Each reads the project's
``.agent/state.db``; with ``--json`` each prints one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import os
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from host._events import EventBus
from host._mediator import Mediator
from host.audit import SQLiteStore, Store, StoreUnavailable, store_for
from host.capsules import capsule_of
from host.declare import Project, discover, load_or_build_scope, resolve_project
from host.errors import HostError
from host.policy import (
    DenyAll,
    PolicyConfig,
    PolicySource,
    lint_policy,
    load_policy,
    missing_policy,
)

from ._common import Subparsers, add_call_arguments, call_arguments, dumps, note, project_dir

__all__ = ["POLICY_COMMANDS"]

_CALLERS = ("agent", "script", "app", "tool")


def _resolve(args: argparse.Namespace) -> Project:
    return resolve_project(project_dir(args))


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def _print(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(dumps(data) if args.json else text)


async def _open_store(project: Project) -> Store:
    """The project's store as its hosts open it (``TOOLHOST_STORE``, ``[store]``, SQLite)."""
    config = load_policy(project.policy_files, root=project.root)
    try:
        store = store_for(
            config.store.resolve(os.environ),
            project.state_dir,
            stale_after=config.store.stale_after,
        )
        await store.start(f"cli-{uuid.uuid4().hex[:8]}")
    except (StoreUnavailable, ValueError) as exc:
        raise HostError(str(exc)) from None
    return store


def _load(project: Project) -> PolicyConfig:
    """The project's policy; a project with none says so on stderr."""
    config = load_policy(project.policy_files, root=project.root)
    if not config.files:
        note(missing_policy(project.root, config.defaults))
    return config


# -- policy check --------------------------------------------------------------------------


async def _check(args: argparse.Namespace) -> int:
    positional, named = call_arguments(args)
    project = _resolve(args)
    config = _load(project)
    source = PolicySource(config)
    discovery = discover(project.tools_dir)
    scope = await anyio.to_thread.run_sync(load_or_build_scope, discovery)
    mediator = Mediator(  # for its exact lookup, binding and validation; it never dispatches
        discovery,
        config,
        scope=scope,
        policy=source,
        store=SQLiteStore(project.state_dir / "state.db"),  # never opened
        approver=DenyAll(),
        events=EventBus(),
        host_id="check",
    )
    spec = mediator.lookup(args.name)
    bound = mediator.bind(spec, positional, named)
    decision = mediator.decide(spec, bound, args.caller, source.current())
    capsule, capsule_line = capsule_of(config.capsules, spec.file)
    data = {"tool": spec.name, "caller": args.caller, **decision.to_data(), "capsule": capsule}
    lines = [f"{decision.decision} (rule {decision.rule})"]
    if decision.reason:
        lines.append(f"reason: {decision.reason}")
    if len(decision.matched) > 1:
        lines.append(f"matched: {', '.join(decision.matched)}")
    lines.append(f"policy version: {decision.policy_version}")
    lines.append(capsule_line)
    _print(args, data, "\n".join(lines))
    return 0


# -- policy lint ---------------------------------------------------------------------------


async def _lint(args: argparse.Namespace) -> int:
    project = _resolve(args)
    config = _load(project)
    discovery = discover(project.tools_dir)  # names and parameters: no pyright needed
    warnings = lint_policy(config, discovery.tools, root=project.root)
    files = ", ".join(name for name, _ in config.files) or "no policy file"
    if args.json:
        data = {
            "ok": not warnings,
            "files": [name for name, _ in config.files],
            "policy_version": config.version,
            "warnings": [w.to_data() for w in warnings],
        }
        print(dumps(data))
    elif warnings:
        for warning in warnings:
            print(warning)
        count = len(warnings)
        print(f"{count} policy warning{'s' if count > 1 else ''} ({files})")
    else:
        print(f"no policy warnings ({files})")
    return 1 if warnings else 0


# -- policy grants -------------------------------------------------------------------------


async def _grants(args: argparse.Namespace) -> int:
    store = await _open_store(_resolve(args))
    try:
        if args.revoke is not None:
            if not await store.revoke_grant(args.revoke):
                raise HostError(f"there is no live grant {args.revoke}")
            _print(args, {"revoked": args.revoke}, f"revoked grant {args.revoke}")
            return 0
        grants = await store.grants()
    except StoreUnavailable as exc:
        raise HostError(str(exc)) from None
    finally:
        await store.aclose()
    rows = [
        f"{g.id:>4}  {_when(g.created)}  {'allow' if g.allow else 'deny ':5}  {g.caller:6}  "
        f"{g.tool}  {'(every call)' if g.args_sha256 is None else g.summary or ''}"
        for g in grants
    ]
    text = "\n".join(rows) if rows else "no remembered grants"
    _print(args, {"grants": [g.to_data() for g in grants]}, text)
    return 0


# -- audit ---------------------------------------------------------------------------------


async def _audit(args: argparse.Namespace) -> int:
    store = await _open_store(_resolve(args))
    try:
        records = await store.tail(args.tail)
    except StoreUnavailable as exc:
        raise HostError(str(exc)) from None
    finally:
        await store.aclose()
    rows: list[str] = []
    for r in records:
        decided = f"{r.decision or '-'} ({r.rule})" if r.rule else (r.decision or "-")
        if r.approval:
            decided += f" -> {r.approval}"
        line = f"{_when(r.started)}  {r.outcome:8} {r.caller:6}  {r.tool}({r.args_summary or ''})"
        line += f"  {decided}"
        if r.error_kind:
            line += f"  [{r.error_kind}]"
        rows.append(line)
    text = "\n".join(rows) if rows else "the audit trail is empty"
    _print(args, {"records": [r.to_data() for r in records]}, text)
    return 0


# -- registration --------------------------------------------------------------------------


def _add_policy(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    policy = sub.add_parser("policy", help="policy decisions and remembered grants")
    actions = policy.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check", parents=[common], help="the decision for a call and its rule, without running"
    )
    check.add_argument("name", help="the tool name, e.g. add or kanban.close")
    add_call_arguments(check)
    check.add_argument("--caller", choices=_CALLERS, default="app", help="who calls (app)")
    check.set_defaults(handler=_check)
    lint = actions.add_parser(
        "lint",
        parents=[common],
        help="policy mistakes that silently change nothing; exit status 1 if any",
        description="Check the policy files against the tools: globs that match no tool, "
        "conditions on parameters the tools do not have, regexes anchored at one end. "
        "Exit status 1 if there is any warning, so CI can gate on it.",
    )
    lint.set_defaults(handler=_lint)
    grants = actions.add_parser("grants", parents=[common], help="remembered 'always' answers")
    grants.add_argument("--revoke", type=int, metavar="ID", help="revoke the grant ID")
    grants.set_defaults(handler=_grants)


def _add_audit(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    audit = sub.add_parser("audit", parents=[common], help="the audit trail, oldest first")
    audit.add_argument("--tail", type=int, default=20, metavar="N", help="the last N (20)")
    audit.set_defaults(handler=_audit)


POLICY_COMMANDS: list[Callable[[Subparsers, argparse.ArgumentParser], None]] = [
    _add_policy,
    _add_audit,
]
"""Listed in ``host.cli._main.COMMANDS``."""
