"""Planted: the kernel never returns."""


def kernel(x):
    while True:
        pass
