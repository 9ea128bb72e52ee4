"""Planted: the kernel allocates without end."""

import numpy as np


def kernel(x):
    hoard = []
    while True:
        hoard.append(np.ones(64 * 1024 * 1024, dtype=np.uint8))
