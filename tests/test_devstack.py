"""The embedded dev stack: real Temporal and PostgreSQL, started, found, stopped, no orphans."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from conftest import ROOT, private_stack, run_cli
from infra.devstack import (
    DevStack,
    PostgresService,
    StackConfig,
    TemporalService,
    database_password,
    pid_alive,
    port_open,
)


def _config(tmp_path) -> StackConfig:
    return private_stack(tmp_path / "state")


def test_up_is_idempotent_both_services_answer_and_down_leaves_nothing(tmp_path):
    stack = DevStack(_config(tmp_path))
    try:
        assert stack.up() == ["temporal", "postgres"]
        assert stack.up() == []  # already running: left alone
        status = {s["service"]: s for s in stack.status()}
        assert all(s["running"] and s["ready"] for s in status.values())
        pids = [s["pid"] for s in status.values()]

        async def reach() -> tuple[str, int]:
            client = await Client.connect(stack.config.temporal_address)
            info = await client.service_client.workflow_service.get_system_info(
                GetSystemInfoRequest()
            )
            conn = await asyncpg.connect(stack.config.connect_dsn)
            try:
                return info.server_version, await conn.fetchval("SELECT 1")
            finally:
                await conn.close()

        version, one = asyncio.run(reach())
        assert version and one == 1
    finally:
        stopped = stack.down()
        stack.services[1].remove_data()
    assert stopped == ["postgres", "temporal"]
    assert not any(pid_alive(pid) for pid in pids)
    assert stack.down() == []
    assert (stack.config.home / "temporal.sqlite").is_file()  # state is kept for the next up


def test_a_restart_on_the_same_sqlite_file_waits_for_the_old_server(tmp_path):
    config = _config(tmp_path)
    temporal = TemporalService(config)
    for _ in range(2):
        temporal.start()
        old = temporal.pid()
        temporal.stop()  # returns only once the process is gone, so the file is free
        assert not pid_alive(old)
    assert "database is locked" not in temporal.log.read_text()


def test_the_cli_reports_the_stack(tmp_path):
    config = _config(tmp_path)
    env = dict(
        os.environ,
        NEARMISS_HOME=str(config.home),
        NEARMISS_TEMPORAL_PORT=str(config.temporal_port),
        NEARMISS_POSTGRES_PORT=str(config.postgres_port),
    )
    try:
        up = run_cli("dev", "up", env=env)
        assert up.returncode == 0 and "started: temporal, postgres" in up.stdout
        status = run_cli("dev", "status", env=env)
        assert status.stdout.count(" up ") == 2, status.stdout
        password = database_password(config)
        assert password not in status.stdout + status.stderr + up.stdout + up.stderr
    finally:
        down = run_cli("dev", "down", env=env)
        DevStack(config).down()  # in case the command could not
        PostgresService(config).remove_data()
    assert "stopped: postgres, temporal" in down.stdout


def _listening(pid: int) -> list[str]:
    """The local addresses the process listens on (TCP), from ss."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def test_postgres_wants_the_generated_password_and_both_services_listen_on_loopback(tmp_path):
    config = _config(tmp_path)
    stack = DevStack(config)
    try:
        stack.up()
        secret = config.password_file
        assert secret.stat().st_mode & 0o777 == 0o600
        password = database_password(config)
        assert password not in config.dsn and password in config.connect_dsn
        assert str(DevStack(config).status()).count(password) == 0

        async def attempts() -> tuple[int, list[str]]:
            conn = await asyncpg.connect(config.connect_dsn)
            try:
                one = await conn.fetchval("SELECT 1")
            finally:
                await conn.close()
            refused = []
            socket_dir = str(stack.services[1].data / "socket")
            for dsn, kwargs in (
                (config.dsn, {}),  # TCP on loopback, no password
                (config.dsn, {"password": "wrong"}),
                (None, {"host": socket_dir, "port": config.postgres_port, "user": "postgres"}),
            ):
                with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
                    await asyncpg.connect(
                        dsn, database="postgres", passfile="/nonexistent", **kwargs
                    )
                refused.append(dsn or "socket")
            return one, refused

        one, refused = asyncio.run(attempts())
        assert one == 1 and len(refused) == 3
        for service in stack.services:
            addresses = _listening(service.pid())
            assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses
    finally:
        stack.down()
        stack.services[1].remove_data()


def test_a_cluster_made_with_trust_auth_is_put_under_the_password(tmp_path):
    config = _config(tmp_path)
    postgres = PostgresService(config)
    try:
        postgres.start()
        postgres.stop()
        hba = postgres.data / "pg_hba.conf"
        hba.write_text(hba.read_text().replace("scram-sha-256", "trust"))  # as clusters were
        assert postgres.trusts_anyone()
        postgres.start()  # sets the password, rewrites pg_hba.conf, reloads
        assert not postgres.trusts_anyone()

        async def without_password() -> None:
            await asyncpg.connect(config.dsn, passfile="/nonexistent")

        with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
            asyncio.run(without_password())

        async def with_password() -> int:
            conn = await asyncpg.connect(config.connect_dsn)
            try:
                return await conn.fetchval("SELECT 1")
            finally:
                await conn.close()

        assert asyncio.run(with_password()) == 1
        log = postgres.log.read_text()
        assert database_password(config) not in log
    finally:
        postgres.stop()
        postgres.remove_data()


def test_a_test_run_ended_by_sigterm_stops_the_servers_it_started(tmp_path):
    # A test that holds the session's Temporal server; its run is sent SIGTERM (a CI job's
    # timeout): the server must not outlive the run.
    started = tmp_path / "address"
    (tmp_path / "test_holds_the_server.py").write_text(
        "import time\nfrom pathlib import Path\n\n\n"
        "def test_hold(temporal_address):\n"
        f"    Path({str(started)!r}).write_text(temporal_address)\n"
        "    time.sleep(300)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "conftest",
            "-p",
            "no:randomly",
            "-n",
            "0",
            "-o",
            "addopts=",
            str(tmp_path / "test_holds_the_server.py"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.2)
        assert started.exists(), run.communicate(timeout=30)[0].decode()[-2000:]
        port = int(started.read_text().rsplit(":", 1)[1])
        assert port_open(port)
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=60)[0].decode()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode != 0, output  # interrupted, not passed
    left = not port_open(port) or _kill_the_server_on(port)
    assert left is True, output


def _kill_the_server_on(port: int) -> str:
    """A test's leaked dev server on ``port``, killed (the run's own cleanup failed)."""
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if f"--port {port} " in command and "temporal" in command:
                os.kill(int(proc.name), signal.SIGKILL)
                return f"a server still ran on {port}: {command[:200]}"
    return f"something still listens on {port}"
