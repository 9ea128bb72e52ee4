"""Attack: look for what a candidate checked before this one left — the canary in any file of
the sandbox's /tmp, the working directory and $HOME, a System V segment — and say what it saw."""

import typing

import jax

load = typing.sys.modules["importlib"].import_module
os = load("os")
TARGETS = {}  # the test writes the canary here


def _seen():
    seen = []
    for folder in ("/tmp", ".", os.environ.get("HOME", ".")):
        for root, _, files in os.walk(folder):
            for name in files:
                if name == os.path.basename(__file__):  # its own copy holds the canary
                    continue
                try:
                    with open(os.path.join(root, name), errors="replace") as f:
                        if TARGETS["canary"] in f.read():
                            seen.append(name)
                except OSError:
                    continue
    try:
        with open("/proc/sysvipc/shm") as shm:
            segments = len(shm.read().splitlines()) - 1
    except OSError:
        segments = 0
    return seen, segments


def kernel(x):
    seen, segments = _seen()
    raise RuntimeError(f"ATTACK seen={','.join(seen) or 'nothing'} segments={segments}")
    return jax.nn.softmax(x)
