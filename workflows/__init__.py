"""Repair workflows (Temporal): the pure repair state machine and its guards; no I/O here."""
