"""Planted: importing the candidate never finishes."""

import time

time.sleep(3600)


def kernel(x):
    return x
