"""Errors every layer shares: a usage error is the user's input, never a finding or a crash."""

from __future__ import annotations


class UsageError(Exception):
    """The inputs are unusable (bad spec, no kernel...): a one-line reason, exit status 2."""
