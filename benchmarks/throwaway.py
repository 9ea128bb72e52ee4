"""Throw-away services for benchmarks, gone when the block ends (nothing left in /tmp or in
/var/tmp, where PostgreSQL keeps a root user's clusters).

- ``private_postgres()``: a PostgreSQL of its own (the dev stack's binaries, a temp directory,
  a free loopback port); yields the DSN, with the generated password: connect, never print it.
- ``embedded_stack_home(prefix)``: a fresh ``NEARMISS_HOME`` for commands that start the
  embedded stack (``nearmiss.client.service.services``); its cluster is removed afterwards.
- ``baseline_worktree(revision, folder)``: a detached git worktree of another revision of this
  checkout, for measuring side by side (same virtual environment; run its code with
  ``PYTHONPATH`` set to it, e.g. ``CLI`` for its command line), removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from infra.devstack import PostgresService, StackConfig

ROOT = Path(__file__).resolve().parent.parent
# The `nearmiss` command line of whichever tree is first on PYTHONPATH: `python -c CLI check ...`.
CLI = "import sys; from nearmiss.cli.main import main; sys.argv[0] = 'nearmiss'; main()"


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


@contextlib.contextmanager
def baseline_worktree(revision: str, folder: Path):
    """``revision`` checked out at ``folder`` (a detached worktree of this checkout) while the
    block runs; removed with git's bookkeeping afterwards."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(folder), revision], cwd=ROOT, check=True
    )
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT, check=False)
