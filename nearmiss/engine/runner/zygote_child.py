"""Sandbox child that imports JAX once and forks a candidate's child per check from that state.

A candidate's child spends most of its CPU importing JAX (about 0.6 CPU-s of 0.8 for a golden's
check here); its own work, tracing and exporting a few cases, is a fifth of that. This child
imports what a fresh candidate's child has imported before it reads its candidate, no more,
and waits. For each check the engine sends a ``fork`` request over a Unix socket with four
descriptors attached (the new child's message pipes, its log, the pipe for its exit status).
This child empties the sandbox's ``/tmp`` of what the last one left, then forks a middle
process, which forks the candidate's child and waits to report how it ended; the child serves
one candidate exactly as a spare one does (``candidate_child.serve``: it waits for the
``load`` message that names it). The engine moves it into a cgroup of its own, with a fresh
child's limits, before it sends ``load``: the candidate's first line runs with them.

What the candidate's child shares with this one, and why that holds (``runner.zygote``):

- its memory is a copy (fork): nothing it writes reaches this process. This process (and the
  middle one) is not dumpable (``PR_SET_DUMPABLE`` 0), so its memory cannot be opened through
  ``/proc`` by a process of the same user; ``ptrace`` and ``process_vm_writev`` are refused by
  the seccomp filter besides;
- the sandbox (its mounts, PID, IPC and network namespaces): one candidate's child at a time,
  never two; the engine kills the last one's cgroup and empties the folders it could write,
  and puts back their mode, owner, times and attributes, before it asks for the next; this
  child does the same for /tmp (``_Tmp``); System V IPC objects, which would outlive it, are
  refused;
- JAX's backend is not started here (its thread pools would not survive a fork): each child
  starts its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import sys

from nearmiss.engine.runner.child import start_child
from nearmiss.engine.runner.folder_state import noted, put_back
from nearmiss.engine.runner.protocol import CHANNEL_ENV

PR_SET_DUMPABLE = 4
MAX_REQUEST = 65536
SANDBOX_TMP = "/tmp"
RM = "/bin/rm"


def _not_dumpable() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _reap() -> None:
    """Collect the children that have ended (the engine has killed each one's cgroup)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _unescaped(field: str) -> str:
    """A mount table's path with its octal escapes (``\\040`` for a space) read. By hand: the
    ``unicode_escape`` codec would load a module a fresh child does not have, and every child
    forked after would show it in ``sys.modules``."""
    parts = field.split("\\")
    text = parts[0]
    for part in parts[1:]:
        code = part[:3]
        if len(code) == 3 and all(c in "01234567" for c in code):
            text += chr(int(code, 8)) + part[3:]
        else:
            text += "\\" + part
    return text


def _mount_points() -> set[str]:
    """The folders something is mounted on in this sandbox (its home, the code folder...)."""
    found = set()
    with open("/proc/self/mountinfo") as table:
        for line in table:
            found.add(_unescaped(line.split()[4]))
    return found


class _Tmp:
    """The sandbox's /tmp as this child found it at its start: the folders mounted below it
    (this sandbox's home and code folder), the folders in it that lead to them, and the state
    of those (``folder_state``)."""

    def __init__(self) -> None:
        self.mounts = _mount_points()
        self.leading = {SANDBOX_TMP}
        for mount in self.mounts:
            if mount.startswith(SANDBOX_TMP + "/"):
                parts = mount.split("/")
                self.leading.update("/".join(parts[:end]) for end in range(3, len(parts)))
        # The folders of /tmp's own file system (itself a mount): a bind mount's folder is its
        # source's, the engine's to put back.
        # Put back from the top: a folder its child made unsearchable hides those below it.
        owned = {SANDBOX_TMP} | (self.leading - self.mounts)
        self.states = {path: noted(path) for path in sorted(owned, key=lambda p: p.count("/"))}

    def put_back(self) -> bool:
        return all(
            state is not None and put_back(path, state) for path, state in self.states.items()
        )

    def emptied(self) -> bool:
        """Empty /tmp of what a candidate's child left there and put its folders back as they
        were (first, so that a mode it set cannot keep this child out; again, after removing);
        then say whether nothing else is left. Everything else goes by coreutils' ``rm`` (any
        depth, no link followed), named one by one: never a mount, nor a folder above one."""
        try:
            if not self.put_back():
                return False
            doomed, pending = [], [SANDBOX_TMP]
            while pending:
                folder = pending.pop()
                for name in os.listdir(folder):
                    path = os.path.join(folder, name)
                    if path in self.mounts:
                        continue
                    if path in self.leading and not os.path.islink(path):
                        pending.append(path)
                    else:
                        doomed.append(path)
            if doomed:  # not ``subprocess``: a fresh child has not imported it, nor will a fork
                remover = os.fork()
                if remover == 0:
                    with contextlib.suppress(OSError):
                        os.execv(RM, [RM, "-rf", "--one-file-system", "--", *doomed])
                    os._exit(127)
                os.waitpid(remover, 0)
            for folder, folders, files in os.walk(SANDBOX_TMP):
                if files or folder not in self.leading:
                    return False
                folders[:] = [f for f in folders if os.path.join(folder, f) not in self.mounts]
            return self.put_back()
        except OSError:
            return False


def _become_candidate_child(fds: list[int], engine: socket.socket, write_fd: int) -> None:
    """In the forked process: drop this child's channel, take the new one, and serve one
    candidate as a spare candidate's child does."""
    to_child, from_child, log, status = fds
    engine.close()
    os.close(write_fd)
    os.close(status)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ[CHANNEL_ENV] = f"{to_child},{from_child}"
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # its global generator, seeded at import, would repeat in every fork
        numpy.random.seed()
    from nearmiss.engine.runner import candidate_child

    candidate_child.main()
    os._exit(0)


def _watch(child: int, status: int) -> None:
    """In the middle process: wait for the candidate's child and tell the engine how it ended
    (its exit status, or the signal that killed it, as ``Popen.returncode`` gives them)."""
    try:
        _, code = os.waitpid(child, 0)
        os.write(status, str(os.waitstatus_to_exitcode(code)).encode())
    finally:
        os._exit(0)


def _fork_twice(fds: list[int], engine: socket.socket, write_fd: int) -> int:
    """Start the candidate's child from a middle process that only waits for it and reports how
    it ended (``fds[3]``, the engine's status pipe); its pid in the namespace. Its parent is not
    this process: a child that kills its parent, as a plain run of it may (a fresh child's is
    the namespace's init, which no signal from inside can kill), ends only the middle and the
    report of its status; killing this process would end the sandbox, and the child in it."""
    said, told = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(said)
        child = os.fork()
        if child == 0:
            os.close(told)
            _become_candidate_child(fds, engine, write_fd)
        engine.close()
        os.close(write_fd)
        for fd in fds[:3]:  # the engine sees the child's channel close when the child ends
            os.close(fd)
        os.write(told, str(child).encode())
        os.close(told)
        _watch(child, fds[3])
    os.close(told)
    for fd in fds:
        os.close(fd)
    with os.fdopen(said, "rb") as pipe:
        return int(pipe.read() or b"-1")


def main() -> None:
    channel = start_child()
    # The import every candidate's child needs before it reads its candidate; not the backend.
    # What a fresh candidate's child imports before its candidate, and no more (a module more
    # in ``sys.modules`` would tell a forked child from a fresh one).
    import jax  # noqa: F401

    from nearmiss.engine.runner import candidate_child  # noqa: F401

    _not_dumpable()
    tmp = _Tmp()
    engine = socket.socket(fileno=channel.reader.fd)
    channel.send(event="ready")
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(engine, MAX_REQUEST, 4)
        except OSError:
            break
        if not data:
            break
        try:
            request = json.loads(data)
        except ValueError:
            break
        if request.get("cmd") != "fork" or len(fds) != 4:
            break
        _reap()
        if not tmp.emptied():  # the engine starts a fresh child, and a new zygote after
            for fd in fds:
                os.close(fd)
            channel.send(event="unclean")
            break
        channel.send(event="forked", pid=_fork_twice(fds, engine, channel.write_fd))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
