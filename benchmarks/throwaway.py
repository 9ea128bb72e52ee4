"""Throw-away services for benchmarks, gone when the block ends (nothing left in /tmp or in
/var/tmp, where PostgreSQL keeps a root user's clusters).

- ``private_postgres()``: a PostgreSQL of its own (the dev stack's binaries, a temp directory,
  a free loopback port); yields the DSN, with the generated password: connect, never print it.
- ``embedded_stack_home(prefix)``: a fresh ``NEARMISS_HOME`` for commands that start the
  embedded stack (``nearmiss.client.service.services``); its cluster is removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from pathlib import Path

from infra.devstack import PostgresService, StackConfig


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def embedded_stack_home(prefix: str):
    from nearmiss.client.settings import Settings

    home = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["NEARMISS_HOME"] = str(home)
    try:
        yield home
    finally:
        PostgresService(Settings.from_env().stack).remove_data()  # stopped by then
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def private_postgres():
    home = Path(tempfile.mkdtemp(prefix="nearmiss-bench-postgres-"))
    service = PostgresService(StackConfig(home=home, postgres_port=_free_port()))
    try:
        service.start()
        yield service.config.connect_dsn
    finally:
        service.stop()
        service.remove_data()
        shutil.rmtree(home, ignore_errors=True)
