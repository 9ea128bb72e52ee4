"""Planted: an exception while the candidate is imported (a finding: compile_error)."""

BLOCK = {"rows": 8}["cols"]


def kernel(x):
    return x
