"""The sandboxed runner: spec and candidate execute in child processes, never in the caller."""
