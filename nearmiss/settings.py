"""Where the repair machinery finds its services: configured ones, or the embedded dev stack.

``TEMPORAL_ADDRESS`` (host:port) and ``NEARMISS_DATABASE_URL`` (a PostgreSQL DSN) point at
running services; without them the embedded stack of ``infra.devstack`` is used, under
``NEARMISS_HOME`` (default ``.nearmiss``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from infra.devstack import StackConfig


@dataclass(frozen=True)
class Settings:
    temporal_address: str
    database_url: str
    embedded: bool  # True when either service is the embedded dev stack
    stack: StackConfig
    namespace: str = "default"

    @property
    def embedded_database(self) -> bool:
        return self.stack is not None and self.database_url == self.stack.dsn

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        stack = StackConfig.from_env(env)
        address = env.get("TEMPORAL_ADDRESS")
        dsn = env.get("NEARMISS_DATABASE_URL")
        return cls(
            temporal_address=address or stack.temporal_address,
            database_url=dsn or stack.dsn,
            embedded=not (address and dsn),
            stack=stack,
            namespace=env.get("TEMPORAL_NAMESPACE", "default"),
        )
