"""Planted: the candidate crashes the interpreter (SIGSEGV) when the kernel is traced."""

import ctypes


def kernel(x):
    ctypes.string_at(0)
    return x
