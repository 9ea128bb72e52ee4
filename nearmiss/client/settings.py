"""Where the repair machinery finds its services: configured ones, or the embedded dev stack.

``TEMPORAL_ADDRESS`` (host:port) and ``NEARMISS_DATABASE_URL`` (a PostgreSQL DSN) point at
running services; without them the embedded stack of ``infra.devstack`` is used, under
``NEARMISS_HOME`` (default ``.nearmiss``), with the password generated there. ``database_url``
may carry a password: never print or log it (``StackConfig.dsn`` is the printable form).
``NEARMISS_RECONNECT_S`` bounds how long a command that follows a fleet waits for Temporal to
come back before it gives up (default 300 s).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from infra.devstack import StackConfig

DEFAULT_RECONNECT_S = 300.0


@dataclass(frozen=True)
class Settings:
    temporal_address: str
    database_url: str
    embedded: bool  # True when either service is the embedded dev stack
    stack: StackConfig
    namespace: str = "default"
    reconnect_s: float = DEFAULT_RECONNECT_S

    def __repr__(self) -> str:  # the DSN may hold a password
        return f"Settings(temporal_address={self.temporal_address!r}, embedded={self.embedded})"

    @property
    def embedded_database(self) -> bool:
        stack = self.stack  # (a configured DSN must not make the embedded stack's password)
        return (
            stack is not None
            and stack.password_file.is_file()
            and self.database_url == stack.connect_dsn
        )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        stack = StackConfig.from_env(env)  # (which reads os.environ too when env is None)
        values: Mapping[str, str] = os.environ if env is None else env
        address = values.get("TEMPORAL_ADDRESS")
        dsn = values.get("NEARMISS_DATABASE_URL")
        return cls(
            temporal_address=address or stack.temporal_address,
            database_url=dsn or stack.connect_dsn,
            embedded=not (address and dsn),
            stack=stack,
            namespace=values.get("TEMPORAL_NAMESPACE", "default"),
            reconnect_s=float(values.get("NEARMISS_RECONNECT_S", DEFAULT_RECONNECT_S)),
        )
