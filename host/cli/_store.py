"""``toolhost store migrate|check``: the PostgreSQL store several hosts share.

The URL comes from ``--url``, else ``TOOLHOST_STORE``, else the project policy's
``[store] url``, as a host finds it. ``migrate`` brings the schema up to date (hosts do it
too when they start; this is for a deployment that migrates before it rolls out);
``check`` says whether the database answers, which schema it has against this
toolhost's, which hosts are registered and how long each has been silent, and what the
tables hold. Neither prints a password.
"""

from __future__ import annotations

import argparse
import os

from host.audit import StoreUnavailable, check_store, migrate_store
from host.declare import resolve_project
from host.errors import HostError
from host.policy import load_policy

from ._common import Subparsers, dumps, project_dir

__all__ = ["STORE_COMMANDS", "add_store"]


def _url(args: argparse.Namespace) -> tuple[str, float]:
    """The store's URL and ``stale_after``; a project without a PostgreSQL store: an error."""
    stale_after = 30.0
    if args.url:
        url: str | None = args.url
    else:
        project = resolve_project(project_dir(args))
        config = load_policy(project.policy_files, root=project.root)
        stale_after = config.store.stale_after
        try:
            url = config.store.resolve(os.environ)
        except ValueError as exc:
            raise HostError(str(exc)) from None
    if url is None:
        raise HostError(
            "this project's hosts use SQLite (.agent/state.db): give --url, set "
            'TOOLHOST_STORE, or write [store] url = { env = "NAME" } in the policy'
        )
    if not url.startswith(("postgresql://", "postgres://")):
        raise HostError("the store URL must start with postgresql://")
    return url, stale_after


async def _migrate(args: argparse.Namespace) -> int:
    url, _ = _url(args)
    try:
        applied = await migrate_store(url)
    except StoreUnavailable as exc:
        raise HostError(str(exc)) from None
    if args.json:
        print(dumps({"ok": True, "applied": applied}))
    elif applied:
        print(f"migrated: applied schema version(s) {', '.join(map(str, applied))}")
    else:
        print("the schema is up to date")
    return 0


async def _check(args: argparse.Namespace) -> int:
    url, stale_after = _url(args)
    try:
        report = await check_store(url, stale_after)
    except StoreUnavailable as exc:
        raise HostError(str(exc)) from None
    ok = report["schema"] == report["expected"]
    if args.json:
        print(dumps({"ok": ok, **report}))
        return 0 if ok else 1
    print(f"store: {report['url']} (PostgreSQL {report['server']})")
    schema, expected = report["schema"], report["expected"]
    if schema == 0:
        print(f"schema: none yet (this toolhost speaks {expected}): run toolhost store migrate")
    elif schema < expected:
        print(
            f"schema: {schema}, older than this toolhost's {expected}: run toolhost store migrate"
        )
    elif schema > expected:
        print(f"schema: {schema}, newer than this toolhost's {expected}: upgrade toolhost")
    else:
        print(f"schema: {schema} (up to date)")
    if schema:
        hosts = report["hosts"]
        print(f"hosts: {len(hosts)}")
        for host in hosts:
            state = "silent: taken for dead soon" if host["stale"] else "alive"
            print(f"  {host['host_id']}  last heartbeat {host['silent_for']:.1f}s ago ({state})")
        print(
            f"audit: {report['audit']} records, {report['audit_open']} open; "
            f"grants: {report['grants_live']} live; pending approvals: {report['pending']}"
        )
    return 0 if ok else 1


def add_store(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    store = sub.add_parser("store", help="the PostgreSQL store several hosts share")
    actions = store.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, handler, text in (
        ("migrate", _migrate, "create or bring up to date the store's schema"),
        ("check", _check, "whether the store answers, its schema, hosts and contents"),
    ):
        action = actions.add_parser(name, parents=[common], help=text)
        action.add_argument(
            "--url",
            metavar="URL",
            help="the postgresql:// URL (default: TOOLHOST_STORE, else the policy's [store])",
        )
        action.set_defaults(handler=handler)


STORE_COMMANDS = [add_store]
"""The sub-commands this module adds to ``toolhost``."""
