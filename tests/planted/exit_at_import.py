"""Planted: the candidate ends its own process while being imported."""

import os

os._exit(3)


def kernel(x):
    return x
