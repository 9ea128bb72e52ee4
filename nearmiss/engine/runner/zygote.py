"""Candidate's children forked from a sandboxed zygote that has imported JAX already.

A fresh candidate's child costs a check about 0.8 CPU-s, 0.6 of which is importing JAX; a spare
(``runner.spares``) only moves that cost earlier. A zygote (``zygote_child``) pays it once per
worker, limits and user folder (the folder the sandbox shows the candidate in is fixed when it
starts): for each check it forks a process that becomes the candidate's child, and that process
starts from JAX imported (its own backend started after the fork). A zygote serves the checks
of one folder one after another: a repair's rounds, a search's edits, a fleet's kernels of one
folder; the first check of a folder costs what a fresh child does.

Isolation, compared with a fresh child (``zygote_child`` says what the processes share):

- the forked child runs in a cgroup of its own, made and entered before the engine names its
  candidate (``ForkedChild._start``): its memory and process limits, and the kill that ends it,
  are those of a fresh child. A zygote is used only where the engine can make cgroups;
- one candidate's child at a time per zygote (``busy``): checks side by side get a zygote each;
- the zygote's home is read-only in its sandbox. Its children write two folders of it: the
  code folder (shown at the user's folder, as a plain run's working directory is writable)
  and their work folders, in ``WORK_FOLDER``. Between two children the engine empties both,
  never through a link, after checking they are the folders they were at the start (device and
  inode), and puts back their mode, owner, times and attributes (``folder_state``): a home
  changed otherwise ends the zygote (``release``). The zygote does the same for the sandbox's
  ``/tmp`` and the folders in it that lead to its mounts, or says it could not, which ends it
  too;
- the zygote never reads a candidate; it is not dumpable, and the seccomp filter refuses
  ``ptrace`` and ``process_vm_writev``: no child can change what it forks next. A child that
  stops it has it continued before the next fork (``resume``); one that kills it kills its own
  sandbox, and the next check starts a new zygote.

What a forked child can still tell from a fresh one needs the operating system (``/proc``: its
parent, its cgroup's path, its pid, the zygote's command line; ``prctl``), which the static gate
refuses, or two checks to compare (Python's hash seed and the address layout are the zygote's,
the same in each of its children; a fresh child draws its own). Its modules are a fresh
child's, and numpy's global generator is seeded anew in each (``tests/test_zygote.py``). Its
memory limit counts what it writes, not the pages of JAX it shares with the zygote, which are
charged to the zygote's group: a few hundred MB more room than a fresh child has.

Only in processes that keep children between checks (``spares.forks_candidates``), on a CPU,
in the sandbox.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nearmiss.engine.runner import spares
from nearmiss.engine.runner.folder_state import FolderState, noted, put_back, same_folder
from nearmiss.engine.runner.sandbox import (
    CODE_FOLDER,
    ChildDied,
    ChildFailure,
    Limits,
    SandboxChild,
    _process_tree,
    _running,
)
from nearmiss.engine.runner.scratch import remove_tree, scratch_dir

ZYGOTE_MODULE = "nearmiss.engine.runner.zygote_child"
ZYGOTE_PREFIX = "nearmiss-zygote-"
WORK_FOLDER = "work"  # in a zygote's home: its children's work folders
FORK_TIMEOUT_S = 10.0
MAX_ZYGOTES = 4  # user folders (and limits) with a zygote waiting, per process

_lock = threading.Lock()
_zygotes: list[Zygote] = []  # least recently used first
CLAIMED = object()  # a zygote's ``busy`` between a check taking it and its child being forked
_numbers = itertools.count()


class Zygote(SandboxChild):
    """The zygote as the engine sees it: a sandbox child whose engine channel is a Unix socket,
    so that a fork request can carry the new child's descriptors."""

    busy: ForkedChild | object | None = None  # the child it serves (``CLAIMED`` until forked)
    key: tuple = ()  # what it was started for (``fork``)
    # Its home is read-only in the sandbox: no child can rename, replace or add to what the
    # engine finds there. The children write only their work folders, in WORK_FOLDER, and the
    # code folder (shown where its user keeps it), both emptied between two children.
    home_writable = False
    folders: dict[str, FolderState] = {}  # the folders its children write, as at its start

    @property
    def work_dir(self) -> Path:
        return self.home / WORK_FOLDER

    def _message_pipe(self) -> tuple[int, int]:
        child_end, engine_end = socket.socketpair()
        return child_end.detach(), engine_end.detach()

    def alive(self) -> bool:
        return (
            self.process is not None
            and self.process.poll() is None
            and self.started_by.is_alive()
            and not (self.group is not None and self.group.breaches())
        )

    def resume(self) -> None:
        """Continue every process of the zygote's own group: a candidate's child may have sent
        them SIGSTOP, which would leave the next check waiting for a fork (``FORK_TIMEOUT_S``)."""
        if self.group is not None:
            for pid in self.group.members():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)

    def request_fork(self, descriptors: list[int]) -> int:
        """Ask for a child with these four descriptors (its reading and writing ends, its log,
        the writing end of its status pipe); the child's pid in the sandbox's PID namespace."""
        engine = socket.socket(fileno=os.dup(self._to_child_w))
        try:
            socket.send_fds(engine, [json.dumps({"cmd": "fork"}).encode()], descriptors)
        finally:
            engine.close()
        message = self.receive(FORK_TIMEOUT_S)
        if message.get("event") != "forked" or not isinstance(message.get("pid"), int):
            raise ChildDied(f"the zygote answered {message.get('event')!r} to a fork")
        return message["pid"]

    def host_pid(self, inner: int) -> int | None:
        """The host's pid of the process that is ``inner`` in the sandbox's namespace."""
        assert self.process is not None
        for pid in _process_tree(self.process.pid)[1:]:
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("NSpid:") and int(line.split()[-1]) == inner:
                        return pid
        return None


class _ForkedProcess:
    """What ``SandboxChild`` asks of its ``Popen``, for a process the zygote started: how it
    ended comes from the process that waits for it (``zygote_child._watch``), on ``status``."""

    def __init__(self, pid: int, status: int) -> None:
        self.pid = pid
        self.status = status
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not _running(self.pid):
            self.returncode = self._reported()
        return self.returncode

    def _reported(self, wait_s: float = 1.0) -> int:
        """The status its waiter reports (it writes it as soon as it has reaped the process);
        -9 where none comes: the waiter was killed, and how the child ended is unknown."""
        with contextlib.suppress(OSError, ValueError):
            ready, _, _ = select.select([self.status], [], [], wait_s)
            if ready:
                return int(os.read(self.status, 32) or b"-9")
        return -9

    def wait(self, timeout_s: float = 10.0) -> int | None:
        deadline = time.monotonic() + timeout_s
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.returncode


class ForkedChild(SandboxChild):
    """A candidate's child the zygote forked, in a cgroup of its own; a spare's interface: the
    check copies its candidate into ``code_dir`` and sends ``load``."""

    def __init__(self, zygote: Zygote, limits: Limits) -> None:
        self.zygote = zygote
        self._status: int | None = None  # the reading end of its status pipe
        home = zygote.work_dir / f"forked-{next(_numbers)}"
        super().__init__(spares.CANDIDATE_MODULE, home, limits, zygote.platform_hint)

    def _start(self, read_only: tuple[Path, ...], writable: tuple[Path, ...]) -> None:
        if self.group is None:
            raise ChildDied("no cgroup to hold a forked child")
        assert self.zygote.code_dir is not None
        self.code_dir, self.code_shown_at = self.zygote.code_dir, self.zygote.code_shown_at
        self.started_by = self.zygote.started_by
        self._log_fd = os.open(
            self.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        self._status, status_end = os.pipe()
        try:
            try:
                inner = self.zygote.request_fork([*self._child_ends, self._log_fd, status_end])
            finally:
                self._close_child_ends()
                os.close(status_end)
            pid = self.zygote.host_pid(inner)
            if pid is None:
                raise ChildDied("the forked child is not in the zygote's sandbox")
            # Before the candidate is named: every line of it runs held to this child's limits.
            self.group.adopt(pid)
        except BaseException:
            self.group.remove()  # kills the child too, where it was adopted already
            os.close(self._status)
            os.close(self._log_fd)
            self._status = self._log_fd = None
            raise
        self.process = _ForkedProcess(pid, self._status)  # type: ignore[assignment]

    def close(self) -> None:
        super().close()
        if self._status is not None:
            os.close(self._status)
            self._status = None
        release(self.zygote, self)


def release(zygote: Zygote, child: ForkedChild) -> None:
    """The zygote's child is closed: its work folder and the code folder emptied (never through
    a link) and put back as they were at the zygote's start (``folder_state``), and the zygote
    free, if both are still those folders and nothing else came into its home; otherwise the
    zygote is closed."""
    ok = (
        sorted(p.name for p in zygote.home.iterdir())
        == sorted(zygote.folders)
        == sorted((CODE_FOLDER, WORK_FOLDER))
    )
    for name, state in zygote.folders.items():
        folder = zygote.home / name
        ok = ok and same_folder(folder, state)
        if ok:
            try:
                for entry in list(folder.iterdir()):
                    remove_tree(entry)
                ok = not any(folder.iterdir()) and put_back(folder, state)
            except OSError:
                ok = False
    if not ok:
        _forget(zygote)
        return
    with _lock:
        if zygote.busy is child:
            zygote.busy = None


# Zygotes are started on a thread of their own that lives as long as the process: bubblewrap's
# --die-with-parent ends a sandbox with the thread that started it, and a check's threads end
# with the check.
_keeper_jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue]] = queue.Queue()
_keeper: threading.Thread | None = None


def _keep() -> None:
    while True:
        job, answer = _keeper_jobs.get()
        try:
            answer.put((job(), None))
        except BaseException as exc:  # handed to the caller
            answer.put((None, exc))


def _on_keeper(job: Callable[[], Any]) -> Any:
    global _keeper
    with _lock:
        if _keeper is None:
            _keeper = threading.Thread(target=_keep, name="nearmiss-zygotes", daemon=True)
            _keeper.start()
    answer: queue.Queue = queue.Queue()
    _keeper_jobs.put((job, answer))
    result, error = answer.get()
    if error is not None:
        raise error
    return result


def _start_zygote(limits: Limits, platform: str, shows_code_at: Path | None) -> Zygote:
    home = scratch_dir(ZYGOTE_PREFIX)
    (home / WORK_FOLDER).mkdir()
    try:
        zygote = Zygote(
            ZYGOTE_MODULE,
            home,
            limits,
            platform,
            read_only=(home,),
            writable=(home / WORK_FOLDER,),
            shows_code_at=shows_code_at,
        )
    except BaseException:
        remove_tree(home)
        raise
    message = zygote.receive(limits.import_timeout_s)
    if message.get("event") != "ready":
        _close([zygote])
        raise ChildDied("the zygote did not start")
    # Its log is read through the engine's descriptor only.
    zygote.log_path.unlink()
    zygote.folders = {
        name: state for name in (CODE_FOLDER, WORK_FOLDER) if (state := noted(home / name))
    }
    return zygote


def fork(limits: Limits, platform: str, shows_code_at: Path | None) -> ForkedChild | None:
    """A candidate's child forked from one of this worker's zygotes for these limits and folder
    (one started now where none waits idle: checks running side by side get one each), or None
    where zygotes are not used (``spares.forks_candidates``) or one cannot be had: the caller
    starts a fresh child."""
    if not spares.forks_candidates(platform):
        return None
    key = (spares.key(ZYGOTE_MODULE, limits, platform), str(shows_code_at))
    dead: list[Zygote] = []
    zygote = None
    with _lock:
        for candidate in [z for z in _zygotes if z.key == key and z.busy is None]:
            _zygotes.remove(candidate)
            if zygote is None and candidate.alive():
                zygote = candidate
            else:
                dead.append(candidate)
        if zygote is not None:
            _zygotes.append(zygote)  # the most recently used last
            zygote.busy = CLAIMED
    _close(dead)
    try:
        if zygote is None:
            zygote = _on_keeper(lambda: _start_zygote(limits, platform, shows_code_at))
            zygote.key, zygote.busy = key, CLAIMED
            with _lock:
                _zygotes.append(zygote)
                idle = [z for z in _zygotes if z.busy is None]
                evicted = idle[: max(0, len(_zygotes) - MAX_ZYGOTES)]
                for old in evicted:
                    _zygotes.remove(old)
            _close(evicted)
        else:
            zygote.resume()
        child = ForkedChild(zygote, limits)
    except (ChildFailure, OSError):
        if zygote is not None:
            _forget(zygote)
        return None
    with _lock:
        zygote.busy = child
    return child


def _forget(zygote: Zygote) -> None:
    """Stop using a zygote: out of the list, closed, its home removed."""
    with _lock:
        if zygote in _zygotes:
            _zygotes.remove(zygote)
    _close([zygote])


def _close(zygotes: list[Zygote]) -> None:
    for zygote in zygotes:
        zygote.close()
        remove_tree(zygote.home)


def kept_processes() -> set[int]:
    """The processes of the zygotes kept waiting: each one's own group's members (its sandbox
    and itself), never a process of a child it forked, which runs in a group of its own."""
    with _lock:
        zygotes = list(_zygotes)
    return {pid for z in zygotes if z.group is not None for pid in z.group.members()}


def kept_homes() -> set[Path]:
    with _lock:
        return {z.home for z in _zygotes}


def close_all() -> None:
    with _lock:
        zygotes = list(_zygotes)
        _zygotes.clear()
    _close(zygotes)


spares.also_close(close_all)
