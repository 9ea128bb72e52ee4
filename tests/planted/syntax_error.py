"""Planted: a syntax error in the candidate (a finding: compile_error)."""

import jax


def kernel(x)
    return x
