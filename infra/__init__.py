"""Infrastructure: the dev stack (Temporal + PostgreSQL), worker launch, deployment."""
