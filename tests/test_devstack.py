"""The embedded dev stack: real Temporal and PostgreSQL, started, found, stopped, no orphans."""

from __future__ import annotations

import asyncio
import os

import asyncpg
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from conftest import private_stack, run_cli
from infra.devstack import DevStack, PostgresService, StackConfig, TemporalService, pid_alive


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
            conn = await asyncpg.connect(stack.config.dsn)
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
    finally:
        down = run_cli("dev", "down", env=env)
        PostgresService(config).remove_data()
    assert "stopped: postgres, temporal" in down.stdout
