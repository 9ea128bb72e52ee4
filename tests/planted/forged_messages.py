"""Planted: at import, writes garbage to every inherited file descriptor, hoping to reach the
engine's message pipe and confuse (or crash) it."""

import os

for fd in range(3, 64):
    try:
        os.write(fd, b'{"event": "ready"}\n{"event": "case_done", "ok": true}\nnot json\n')
    except OSError:
        pass


def kernel(x):
    return x
