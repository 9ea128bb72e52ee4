"""A control group per sandbox child, so the kernel holds the child to its limits.

The engine's own watch (``sandbox.resident_mb``) sums the resident size of the child's process
tree, and only while the engine waits for that child. Three things escape it, each shown by an
attack that was then certified: memory no process maps (a memfd, a file on a tmpfs), processes
that grow while the engine waits on another child, and the number of processes (RLIMIT_NPROC
does not bind: the sandbox's uid is the engine's, root in CI). A cgroup counts all of these and
the kernel enforces it whatever the engine is doing: ``memory`` charges shared memory to the
group that touched it and kills inside the group at the limit; ``pids`` refuses the fork past
the limit. Each breach is counted by the kernel (``oom_kill``, ``max`` events), and the engine
treats any as the child exceeding its limits.

The ``cpu`` controller, where there is one, shares the cores out between groups rather than
between processes: a child that starts a hundred busy processes gets one group's share, not a
hundred processes' worth, so its daemons cannot slow another session's children into their
timeouts. No quota is set: a child alone on a worker still uses every core (XLA's thread pools).

Where the groups go: cgroup v1 (a hierarchy per controller, as on these machines) under the
engine's own group in the ``memory``, ``pids`` and (where mounted) ``cpu`` hierarchies; cgroup
v2 under the folder named by ``NEARMISS_CGROUP``, which must be delegated to the engine's user
with ``memory`` and ``pids`` (and, for the fair share, ``cpu``) in its
``cgroup.subtree_control`` (v2 lets no group both hold processes and share out controllers, so
the engine's own group cannot serve). Creating them needs write access there:
root, or a delegation. Where there is none the children run under the engine's watch only, and
``available()`` says why; the check reports which of the two held its limits.

The kernel's cgroup files are the whole interface, a few writes per child; ``cgcreate``/
``cgexec`` (libcgroup) would do the same through three more processes per check, and systemd
(``systemd-run --scope``) is not running in the containers this engine is deployed in.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from nearmiss.engine.runner.process_table import start_time

CGROUP_ENV = "NEARMISS_CGROUP"  # a delegated cgroup v2 folder for the children's groups
MOUNTS = Path("/proc/self/mountinfo")
OWN_GROUPS = Path("/proc/self/cgroup")
# Groups are named nearmiss-<pid namespace>-<engine pid>-<its start time>-<n>, so a sweep knows
# their owner (a reused pid is not mistaken for it) and leaves alone the groups of engines in
# other containers (a hierarchy can be shared, pids not).
PREFIX = "nearmiss-"
_numbers = itertools.count()
# How far below its limit a group's peak may stay and still count as having reached it: the
# kernel charges in batches of 64 pages per CPU.
LIMIT_SLACK = 8 * 1024**2


@dataclass(frozen=True)
class _Layout:
    """Where to make groups, and the names of the files that differ between v1 and v2."""

    version: int
    parents: tuple[Path, ...]  # one folder per hierarchy: memory's first, pids' last
    memory_limit: str
    swap_limit: str
    memory_events: str  # holds "oom_kill N"
    cpu_shared: bool  # the cpu controller shares the cores between groups


def _mount_points() -> dict[str, Path]:
    """{controller or "cgroup2": mount point} from this process's mount table."""
    points: dict[str, Path] = {}
    for line in MOUNTS.read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        kind, options = fields[separator + 1], fields[separator + 3].split(",")
        if kind == "cgroup":
            for controller in ("memory", "pids", "cpu"):
                if controller in options:
                    points.setdefault(controller, Path(fields[4]))
        elif kind == "cgroup2":
            points.setdefault("cgroup2", Path(fields[4]))
    return points


def _own_paths() -> dict[str, str]:
    """{controller (or "" for v2): this process's group path}."""
    paths = {}
    for line in OWN_GROUPS.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _writable(folder: Path) -> bool:
    """Whether a group can be made (and removed) in folder: tried, not inferred from modes."""
    probe = folder / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


@cache
def _layout() -> _Layout | str:
    """Where this engine makes its children's groups, or why it cannot."""
    delegated = os.environ.get(CGROUP_ENV)
    if delegated:
        folder = Path(delegated)
        try:
            enabled = (folder / "cgroup.subtree_control").read_text().split()
        except OSError as exc:
            return f"{CGROUP_ENV}={delegated} is not a cgroup v2 folder ({exc.strerror})"
        if not {"memory", "pids"} <= set(enabled):
            return f"{CGROUP_ENV}={delegated} does not share out the memory and pids controllers"
        if not _writable(folder):
            return f"{CGROUP_ENV}={delegated} is not writable by this user"
        cpu_shared = "cpu" in enabled
        return _Layout(2, (folder,), "memory.max", "memory.swap.max", "memory.events", cpu_shared)
    try:
        points, own = _mount_points(), _own_paths()
    except (OSError, ValueError, IndexError) as exc:
        return f"cannot read this process's cgroups ({exc})"
    if "memory" not in points or "pids" not in points:
        return (
            "no cgroup v1 memory and pids hierarchies here; on cgroup v2, "
            f"set {CGROUP_ENV} to a delegated folder"
        )
    memory, pids = (
        points[controller] / own.get(controller, "/").lstrip("/")
        for controller in ("memory", "pids")
    )
    unwritable = [str(parent) for parent in (memory, pids) if not _writable(parent)]
    if unwritable:
        return f"cannot create cgroups in {', '.join(unwritable)} (needs root or a delegation)"
    # The fair share of the cores is kept where the cpu hierarchy is there to keep it.
    cpu = points["cpu"] / own.get("cpu", "/").lstrip("/") if "cpu" in points else None
    cpu_shared = cpu is not None and _writable(cpu)
    parents = (memory, cpu, pids) if cpu is not None and cpu_shared else (memory, pids)
    return _Layout(
        1,
        parents,
        "memory.limit_in_bytes",
        "memory.memsw.limit_in_bytes",
        "memory.oom_control",
        cpu_shared,
    )


def available() -> str | None:
    """None where children get a group each; otherwise why not (for the check's report)."""
    layout = _layout()
    return layout if isinstance(layout, str) else None


def cpu_shared() -> bool:
    """Whether each child's group also gets its own share of the cores (the cpu controller)."""
    layout = _layout()
    return not isinstance(layout, str) and layout.cpu_shared


def _count(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


class ChildGroup:
    """The group (one folder per hierarchy) that one sandbox child and all it starts run in."""

    def __init__(self, layout: _Layout, folders: tuple[Path, ...], memory_mb: int = 0,
                 max_tasks: int = 0) -> None:  # fmt: skip
        self.layout = layout
        self.folders = folders  # [0] holds the memory controller, [-1] the pids one (see _Layout)
        self.memory_mb = memory_mb
        self.max_tasks = max_tasks

    @classmethod
    def create(cls, memory_mb: int, max_tasks: int) -> ChildGroup:
        """A new group with these limits; OSError where none can be made."""
        layout = _layout()
        if isinstance(layout, str):
            raise OSError(layout)
        pid = os.getpid()
        name = f"{PREFIX}{_pid_namespace()}-{pid}-{start_time(pid) or 0}-{next(_numbers)}"
        group = cls(layout, tuple(parent / name for parent in layout.parents), memory_mb,
                    max_tasks)  # fmt: skip
        made = []
        try:
            for folder in group.folders:
                folder.mkdir()  # never one that exists: it would not be this child's alone
                made.append(folder)
            group._limit(memory_mb * 1024**2, max_tasks)
        except OSError:
            cls(layout, tuple(made)).remove()
            raise
        return group

    def _limit(self, memory_bytes: int, max_tasks: int) -> None:
        memory, pids = self.folders[0], self.folders[-1]
        (memory / self.layout.memory_limit).write_text(str(memory_bytes))
        swap = memory / self.layout.swap_limit
        if swap.exists():  # swap counts as memory (v1: memory+swap; v2: swap on its own)
            swap.write_text("0" if self.layout.version == 2 else str(memory_bytes))
        (pids / "pids.max").write_text(str(max_tasks))

    def command(self, argv: list[str]) -> list[str]:
        """argv, run by a shell that first moves itself into the group: everything the child
        does, from its first instruction, is counted."""
        joins = " && ".join(f'echo $$ > "${index + 1}"' for index in range(len(self.folders)))
        script = f'{joins} && shift {len(self.folders)} && exec "$@"'
        procs = [str(folder / "cgroup.procs") for folder in self.folders]
        return ["/bin/sh", "-c", script, "nearmiss-cgroup", *procs, *argv]

    def adopt(self, pid: int) -> None:
        """Move the process ``pid`` (all its threads) into the group, in every hierarchy."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(pid))

    def breaches(self) -> list[str]:
        """The limits the kernel has enforced on this group so far, in words."""
        found = []
        memory, pids = self.folders[0], self.folders[-1]
        with contextlib.suppress(OSError, ValueError):
            events = (memory / self.layout.memory_events).read_text()
            kills = _count(events, "oom_kill")
            if kills and self._reached_its_limit(events):
                found.append(
                    f"memory limit exceeded: the kernel stopped {kills} process(es) of it at "
                    f"{self.memory_mb} MB"
                )
        with contextlib.suppress(OSError, ValueError):
            refused = _count((pids / "pids.events").read_text(), "max")
            if refused:
                found.append(
                    f"process limit exceeded: {refused} fork(s) refused at {self.max_tasks} "
                    "processes and threads"
                )
        return found

    def _reached_its_limit(self, events: str) -> bool:
        """Whether the group's own limit was reached. The kernel counts an OOM kill on the
        victim's group whoever ordered it: an ancestor's limit or the whole host running out
        (another session's hoard, say) must not read as this child's breach."""
        if self.layout.version == 2:
            return _count(events, "oom") > 0  # OOMs this group's memory.max set off
        peak = int((self.folders[0] / "memory.max_usage_in_bytes").read_text())
        return peak >= self.memory_mb * 1024**2 - LIMIT_SLACK

    def members(self) -> list[int]:
        found: set[int] = set()
        for folder in self.folders:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(pid) for pid in (folder / "cgroup.procs").read_text().split())
        return sorted(found)

    def kill(self, timeout_s: float = 5.0) -> None:
        """Kill every process in the group, however it left the child's tree, and wait until
        none is left (a process forking as it is killed is caught by the next round)."""
        if self.layout.version == 2:
            with contextlib.suppress(OSError):
                (self.folders[0] / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + timeout_s
        while (members := self.members()) and time.monotonic() < deadline:
            for pid in members:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and remove the group's folders (an empty group only can go)."""
        self.kill()
        for folder in self.folders:
            for _ in range(200):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy: the last members are still exiting
                    time.sleep(0.005)


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _orphaned_groups(layout: _Layout) -> list[Path]:
    """Groups made by engines of this pid namespace that are no longer running."""
    found = []
    for parent in layout.parents:
        with contextlib.suppress(OSError):
            for folder in parent.glob(f"{PREFIX}{_pid_namespace()}-*-*-*"):
                owner, started = folder.name.split("-")[2:4]
                numbers = owner.isdigit() and started.isdigit()
                if numbers and start_time(int(owner)) != int(started):
                    found.append(folder)
    return found


def remove_orphaned_groups() -> int:
    """Empty and remove the groups of dead engines; returns how many processes were killed
    (whatever they run: a group holds nothing but what a child of that engine started)."""
    layout = _layout()
    if isinstance(layout, str):
        return 0
    killed = 0
    for folder in _orphaned_groups(layout):
        group = ChildGroup(layout, (folder,))
        killed += len(group.members())
        group.remove()
    return killed
