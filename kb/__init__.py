"""Knowledge base: the PostgreSQL event store, its projections, retrieval and ingestion."""
