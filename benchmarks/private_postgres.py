"""A throw-away PostgreSQL for benchmarks: the dev stack's binaries, a temp directory, a free
loopback port; stopped and removed when the block ends. Yields the DSN (with the generated
password: connect with it, never print it)."""

from __future__ import annotations

import contextlib
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
