"""`nearmiss kb` as a user runs it, against a real PostgreSQL."""

from __future__ import annotations

import json
import os

from conftest import run_cli
from kb.knowledge import seed_entries


def kb(postgres_dsn, *args):
    env = dict(os.environ, NEARMISS_DATABASE_URL=postgres_dsn)
    return run_cli("kb", *args, env=env)


def test_kb_list_json_has_the_seed_with_its_signatures(postgres_dsn):
    result = kb(postgres_dsn, "list", "--json")
    assert result.returncode == 0, result.stderr
    entries = {e["id"]: e for e in json.loads(result.stdout)}
    seeds = seed_entries()
    assert {s["id"] for s in seeds} <= set(entries)
    first = entries[seeds[0]["id"]]
    assert first["status"] == "promoted" and first["title"] == seeds[0]["title"]
    assert set(first["signature"]) >= {"failure_class", "category"}


def test_kb_show_search_and_stats(postgres_dsn):
    seed = seed_entries()[0]
    shown = kb(postgres_dsn, "show", seed["id"], "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["body"] == seed
    missing = kb(postgres_dsn, "show", "no-such-entry")
    assert missing.returncode == 2 and "no entry" in missing.stderr
    found = kb(postgres_dsn, "search", seed["title"], "--json")
    assert seed["id"] in [e["id"] for e in json.loads(found.stdout)]
    stats = json.loads(kb(postgres_dsn, "stats", "--json").stdout)
    assert stats["entries"] >= len(seed_entries()) and stats["by_source"]["seed"] >= 1
    human = kb(postgres_dsn, "stats")
    assert "entries" in human.stdout and "log read to position" in human.stdout
