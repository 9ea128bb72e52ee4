"""Attack: look for what a candidate checked before this one left — the canary in any file of
the sandbox's /tmp (at any depth), the working directory, $HOME and the zygote's home, in an
attribute or a time of /tmp and the working directory, a System V segment — and say what it
saw."""

import typing

import jax

load = typing.sys.modules["importlib"].import_module
os = load("os")
TARGETS = {}  # the test writes the canary here
STAMP = 4102444800123456789  # the time ``zygote_leave`` sets on the folders it shares


def _seen():
    seen = []
    work = os.path.dirname(os.readlink("/proc/self/fd/1"))
    zygote_home = os.path.dirname(os.path.dirname(work))  # where forked from a zygote
    folders = ["/tmp", ".", os.environ.get("HOME", ".")]
    for folder in folders + ([zygote_home] if "zygote" in zygote_home else []):
        for _, _, files, where in os.fwalk(folder):  # by descriptor: any depth
            for name in files:
                if name == os.path.basename(__file__):  # its own copy holds the canary
                    continue
                try:
                    descriptor = os.open(name, os.O_RDONLY, dir_fd=where)
                    text = os.read(descriptor, 1 << 20)
                    os.close(descriptor)
                except OSError:
                    continue
                if TARGETS["canary"].encode() in text:
                    seen.append(name)
    for folder in ("/tmp", "."):
        try:
            if TARGETS["canary"].encode() in os.getxattr(folder, "user.nm"):
                seen.append(f"xattr:{folder}")
        except OSError:
            pass
        if os.stat(folder).st_atime_ns == STAMP:
            seen.append(f"time:{folder}")
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
