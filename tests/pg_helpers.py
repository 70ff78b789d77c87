"""A throw-away PostgreSQL server for the tests, from pgserver (PostgreSQL in a wheel).

pgserver runs ``initdb`` and the first start; from then on this helper owns the server
(``pg_ctl`` stop and start, for the outage tests). pgserver's own clean-up runs at exit
only, and not at all when the test run is killed, and the postmaster is a daemon of its
own: so a watchdog process in a session of its own holds the read end of a pipe, and when
it reads end of file (this process is gone, however it ended) it stops the server and
removes its folder. No server is left behind.

The data folder sits under ``/tmp`` with a short name: the server's socket is in it, and
a socket's path is limited to 107 bytes. As root, pgserver runs the server as a user
``pgserver`` it creates.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

_WATCHDOG = r"""
import os, shutil, subprocess, sys
pg_ctl, data, user, folder = sys.argv[1:5]
try:
    sys.stdin.buffer.read()
except BaseException:
    pass
if os.path.exists(os.path.join(data, "postmaster.pid")):
    subprocess.run([pg_ctl, "-D", data, "-m", "immediate", "-w", "-t", "20", "stop"],
                   user=user or None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
shutil.rmtree(folder, ignore_errors=True)
"""


class PgServer:
    """One PostgreSQL server in a private folder under /tmp; ``close`` removes it all."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="thpg-", dir="/tmp"))
        self.data = self.folder / "data"
        self._user: str | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._started = False

    def start(self) -> PgServer:
        import pgserver  # pyright: ignore[reportMissingTypeStubs]
        from pgserver.postgres_server import (  # pyright: ignore[reportMissingTypeStubs]
            PostgresServer,
        )

        if self._started:
            self._pg_ctl("-w", "-t", "30", "-o", '-h ""', "-o", f"-k {self.data}",
                         "-l", str(self.data / "log"), "start")  # fmt: skip
            return self
        server: Any = pgserver.get_server(self.data, cleanup_mode=None)
        atexit.unregister(server._cleanup)  # this helper owns the server from here on
        PostgresServer._instances.pop(server.pgdata, None)  # pyright: ignore[reportUnknownMemberType]
        server.global_process_id_list.get_and_remove(os.getpid())
        self._user = server.system_user
        self._started = True
        pg_ctl = str(Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_ctl")
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, pg_ctl, str(self.data), self._user or "",
             str(self.folder)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            # Fast for tests, and a crash of the server keeps what was committed (written);
            # synchronous_commit stays on.
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET full_page_writes = off")
            conn.execute("SELECT pg_reload_conf()")
        return self

    def _pg_ctl(self, *args: str) -> None:
        import pgserver  # pyright: ignore[reportMissingTypeStubs]

        pgserver.pg_ctl(list(args), pgdata=self.data, user=self._user, timeout=40)  # pyright: ignore[reportUnknownMemberType]

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return False
        return state != "Z"

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            self._pg_ctl("-w", "-t", "30", "-m", mode, "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.data}"

    def create_database(self) -> str:
        import psycopg

        name = "t" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return name

    def drop_database(self, name: str) -> None:
        import psycopg

        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.url(), autocommit=True) as conn,
        ):
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.stdin is not None:
            watchdog.stdin.close()  # end of file: it removes the folder and ends
            try:
                watchdog.wait(30)
            except subprocess.TimeoutExpired:
                watchdog.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def wait_until(condition: Any, timeout: float = 30.0, what: str = "a condition") -> None:
    """Poll ``condition()`` (a plain function) until it is true, at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
