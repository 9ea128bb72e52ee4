"""What a sandbox child gets: a scrubbed environment and a bubblewrap sandbox around it.

API keys, database DSNs and anything else in the engine's environment never reach candidate code:
variables are copied only when their name is on the allowlist *and* does not look like a secret.

Every child runs under bubblewrap (``bwrap``), a sandbox made for unprivileged containment: as
uid/gid 65534 in its own user, PID, network (loopback only), IPC, UTS and cgroup namespaces, with
no capabilities, a new session (no terminal), its own /proc, a minimal /dev and an empty tmpfs on
/tmp. It sees, read-only, only what Python and JAX need — the system's /usr (and the /bin, /lib
links into it), the dynamic loader's cache, the interpreter and the virtual environment — plus the
engine's own ``nearmiss`` package at a neutral path; and, writable, its own home directory. Never
$HOME, NEARMISS_HOME, the project tree, the database's socket or the host's /tmp. A seccomp filter
(compiled with libseccomp through ``pyseccomp``) answers EPERM to the system calls a contained
process has no use for: ptrace, mounts, namespaces, keyrings, bpf, kernel modules...

Without a working bwrap, children that run candidate code are refused (a UsageError saying how to
install it) unless the user opts out loudly with ``--unsafe-no-sandbox``, which the CLI passes on
as ``NEARMISS_UNSAFE_NO_SANDBOX=1`` (a standalone worker honours it too).
"""

from __future__ import annotations

import errno
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import nearmiss
from nearmiss.engine.errors import UsageError
from nearmiss.engine.runner import cgroups
from nearmiss.engine.runner.blas_threads import one_blas_thread

# The interpreter every child runs: absolute (Python started by a relative path reports a
# relative one, and a sandboxed child starts in its own folder), never resolved (a virtual
# environment's python is a link, and resolving it would leave the environment).
PYTHON = os.path.abspath(sys.executable)

ALLOWED_NAMES = frozenset(
    {
        "PATH",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "JAX_PLATFORMS",
        "JAX_ENABLE_X64",
        "XLA_FLAGS",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_ALLOCATOR",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_HOME",
        "LD_LIBRARY_PATH",
        "TPU_VISIBLE_CHIPS",
        "TPU_CHIPS_PER_PROCESS_BOUNDS",
        "TPU_PROCESS_BOUNDS",
        # Older OpenBLAS builds compute wrong results on some CPUs without these.
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",  # the user's number; else one (``blas_threads``)
    }
)
SECRET_PATTERN = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|DSN|AUTH|COOKIE|SESSION|PRIVATE", re.IGNORECASE
)
# The engine's own package, and the checkout holding it (an editable install's venv does not
# know about it). Unsandboxed children import nearmiss from PROJECT_ROOT; sandboxed ones see only
# the package, bound read-only under ENGINE_MOUNT.
PACKAGE_DIR = Path(nearmiss.__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent
ENGINE_MOUNT = Path("/opt/nearmiss-engine")


def child_environment(
    home: Path,
    parent: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
    engine_path: Path = PROJECT_ROOT,
) -> dict[str, str]:
    """A scrubbed environment for a child whose private directory is ``home`` and which imports
    the engine from ``engine_path``."""
    parent = os.environ if parent is None else parent
    env = {
        name: value
        for name, value in parent.items()
        if name in ALLOWED_NAMES and not SECRET_PATTERN.search(name)
    }
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    # Two children may share one accelerator; neither may grab most of its memory up front.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    one_blas_thread(env)
    env.update(
        HOME=str(home),
        TMPDIR=str(home),
        PYTHONPATH=str(engine_path),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONFAULTHANDLER="1",  # a segfault leaves the Python stack in the child's log
        PYTHONHASHSEED="0",
    )
    env.update(extra or {})
    return env


UNSAFE_ENV = "NEARMISS_UNSAFE_NO_SANDBOX"
UNSAFE_FLAG = "--unsafe-no-sandbox"
UNSAFE_WARNING = (
    "nearmiss: WARNING: running candidate code WITHOUT a sandbox (--unsafe-no-sandbox): "
    "it can read and change anything this user can, including secrets and the event log"
)
SANDBOX_UID = "65534"  # nobody
TMPFS_BYTES = 256 * 1024**2  # the sandbox's /tmp (its TMPDIR is its home, on disk)
OPTIONAL_FLAGS = ("--disable-userns", "--size")  # bwrap >= 0.8
# Read-only from the host (where present): what the dynamic loader and Python need, no more.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
CPU_TOPOLOGY = "/sys/devices/system/cpu"
# Accelerator device nodes, for children that run on one (never needed on CPU).
# CUDA needs the GPUs, the control node and unified memory's: not nvidia-modeset (display),
# nvidia-caps (MIG administration) or nvidia-uvm-tools (profilers).
DEVICE_PATTERNS = (
    "/dev/nvidia[0-9]*",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/accel*",
    "/dev/vfio",
)
# Where a CUDA toolkit usually lives: XLA compiles for a GPU with its ptxas, nvlink and libdevice.
CUDA_HOMES = ("/usr/local/cuda", "/opt/cuda")
# Answered with EPERM inside the sandbox: debugging other processes, mounts and namespaces,
# keyrings, bpf, perf, userfaultfd, kernel images and modules, other processes' memory, file
# handles (the classic container escape), io_uring, clocks, swap, reboot, accounting; and the
# kernel objects counted per user and charged to the user that made the sandbox's namespace, the
# engine's (inotify instances, POSIX message queues): a child holding them all locked the
# engine's user out of them until it died; and System V IPC objects, which outlive the process
# that made them in the sandbox's IPC namespace, which the candidate's children a zygote forks
# share (``runner.zygote``): one candidate would leave them for the next. Neither Python, JAX
# nor XLA uses them.
DENIED_SYSCALLS = (
    "ptrace",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "process_vm_readv",
    "process_vm_writev",
    "open_by_handle_at",
    "name_to_handle_at",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "syslog",
    "quotactl",
    "inotify_init",
    "inotify_init1",
    "fanotify_init",
    "mq_open",
    "shmget",
    "semget",
    "msgget",
)
# clone() flags that make namespaces: refused like unshare(). clone3() passes its flags in memory
# a filter cannot read, so it answers ENOSYS and the C library falls back to clone().
NAMESPACE_CLONE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)


def unsafe_requested() -> bool:
    """Whether the user opted out of the sandbox (``--unsafe-no-sandbox``)."""
    return os.environ.get(UNSAFE_ENV) == "1"


@functools.cache
def seccomp_program() -> bytes | None:
    """The compiled BPF filter for bwrap's ``--seccomp``, or None where libseccomp is missing."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, RuntimeError):  # pyseccomp raises RuntimeError without the lib
        return None
    try:
        rules = seccomp.SyscallFilter(seccomp.ALLOW)
        for name in DENIED_SYSCALLS:
            if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) >= 0:  # not on every arch
                rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
        for flag in NAMESPACE_CLONE_FLAGS:
            rules.add_rule(
                seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag)
            )
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, "clone3") >= 0:
            rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        with tempfile.TemporaryFile() as compiled:
            rules.export_bpf(compiled)
            compiled.seek(0)
            return compiled.read()
    except OSError:
        return None


def _covered(path: Path, by: Iterable[Path]) -> bool:
    return any(path == other or path.is_relative_to(other) for other in by)


# Where the sandbox keeps its own things: a candidate's folder is never shown at or above them.
SANDBOX_PLACES = ("/", "/proc", "/dev", "/sys", "/etc", "/tmp", "/opt")


def can_show_at(place: Path, binds: Iterable[Path]) -> bool:
    """Whether a folder can be shown at ``place`` in a sandbox that also binds ``binds``: an
    absolute, plain path inside none of them (bwrap cannot make a mount point in a read-only
    folder, nor may the folder hide one) and outside the sandbox's own places (below ``/tmp``
    is fine: a tmpfs). Above a bind is fine too: the folder is mounted first, and the bind is
    made inside it, as a project folder holds its virtual environment."""
    if not place.is_absolute() or place != Path(os.path.normpath(place)):
        return False
    if str(place) in SANDBOX_PLACES or any(
        place.is_relative_to(kept) for kept in ("/proc", "/dev", "/sys", "/etc")
    ):
        return False
    fixed = [Path(d) for d in (*SYSTEM_DIRS, *SYSTEM_FILES, CPU_TOPOLOGY)]
    fixed += [*interpreter_paths(), ENGINE_MOUNT]
    return not _covered(place, [*fixed, *binds])


def site_directories() -> list[Path]:
    try:
        import site

        return [Path(p) for p in site.getsitepackages()]
    except AttributeError:  # a virtualenv-style site module
        return []


@functools.cache
def interpreter_paths() -> tuple[Path, ...]:
    """What the interpreter needs read-only: its installation, the virtual environment and any
    site directory outside both — never a folder that holds the project tree or $HOME."""
    wanted = [Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).resolve().parent]
    wanted += site_directories()
    kept: list[Path] = [Path(d) for d in SYSTEM_DIRS]
    for path in wanted:
        path = path.resolve()
        if path.is_dir() and not _covered(path, kept):
            if _holds_protected(path):
                continue
            kept.append(path)
    return tuple(kept[len(SYSTEM_DIRS) :])


@functools.cache
def cuda_toolkit() -> Path | None:
    """The CUDA toolkit XLA compiles GPU kernels with (a folder with ``bin/ptxas``), resolved to
    its real path. Found here, outside the sandbox, where XLA finds it; a child sees it at that
    path, with its tools first on PATH (``device_environment``). On the GPU machine
    ``/usr/local/cuda`` is a link through ``/etc/alternatives``, which a sandbox does not see:
    without this, XLA inside it finds no ``nvlink`` and every compile for the GPU fails."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    ptxas = shutil.which("ptxas")
    if ptxas:
        candidates.append(str(Path(ptxas).resolve().parent.parent))
    candidates += CUDA_HOMES
    for site_dir in site_directories():  # pip's CUDA (nvidia/cu13, nvidia/cuda_nvcc)
        candidates += sorted(glob.glob(f"{site_dir}/nvidia/cu*"))
    found = [
        Path(c).resolve()
        for c in candidates
        if c and (Path(c) / "bin" / "ptxas").is_file() and not _holds_protected(Path(c))
    ]
    with_nvlink = [c for c in found if (c / "bin" / "nvlink").is_file()]
    chosen = with_nvlink or found
    return chosen[0] if chosen else None


def _holds_protected(path: Path) -> bool:
    """Whether showing ``path`` to a sandbox would show the project tree or $HOME (or all)."""
    path = path.resolve()
    return any(p == path or p.is_relative_to(path) for p in (PROJECT_ROOT, Path.home()))


def device_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a child that compiles for a GPU: the CUDA toolkit's tools first on its PATH,
    where XLA looks for ``nvlink`` and ``ptxas``."""
    env = dict(env)
    toolkit = cuda_toolkit()
    if toolkit is not None:
        env["PATH"] = os.pathsep.join(p for p in (str(toolkit / "bin"), env.get("PATH")) if p)
    return env


def links_to_recreate(path: str, visible: Iterable[Path]) -> list[tuple[str, str]]:
    """(target, link) for each symbolic link on the way from ``path`` to what it names that a
    sandbox showing only ``visible`` would lack. XLA finds libdevice only under CUDA's usual
    homes, and ``/usr/local/cuda`` links through ``/etc/alternatives``, outside the sandbox."""
    links, seen = [], set()
    while os.path.islink(path) and path not in seen:
        seen.add(path)
        # relative to the folder the link is really in
        target = os.path.join(os.path.realpath(os.path.dirname(path)), os.readlink(path))
        if not _covered(Path(path), visible):
            links.append((os.path.normpath(target), path))
        path = os.path.normpath(target)
    return links


@dataclass(frozen=True)
class Bubblewrap:
    """A bwrap that has been seen to start a sandboxed interpreter here."""

    executable: str
    seccomp: bytes | None
    supports: frozenset[str] = frozenset()  # of OPTIONAL_FLAGS, those this bwrap knows

    @property
    def level(self) -> str:
        return "bubblewrap+seccomp" if self.seccomp else "bubblewrap"

    def command(
        self,
        argv: Sequence[str],
        home: Path,
        env: Mapping[str, str],
        read_only: Sequence[Path] = (),
        writable: Sequence[Path] = (),
        devices: bool = False,
        seccomp_fd: int | None = None,
        mounts: Sequence[tuple[Path, Path]] = (),
        workdir: Path | None = None,
        home_writable: bool = True,
    ) -> list[str]:
        """The bwrap command line that runs ``argv`` in ``home`` with ``env`` and nothing else:
        read-only system, interpreter and engine package, ``read_only`` files, ``writable``
        directories (home always), accelerator devices when ``devices``; each of ``mounts``
        (host folder, where the sandbox shows it) writable, and ``workdir`` (default: home)
        the working directory. ``home_writable`` False: home is shown read-only."""
        args = [
            self.executable,
            "--unshare-all",
            "--unshare-user",
            "--die-with-parent",
            "--new-session",
            "--uid",
            SANDBOX_UID,
            "--gid",
            SANDBOX_UID,
            "--cap-drop",
            "ALL",
        ]
        if "--disable-userns" in self.supports:  # no nested user namespaces either
            args.append("--disable-userns")
        args.append("--clearenv")
        if devices:
            env = device_environment(env)
        for name, value in env.items():
            args += ["--setenv", name, value]
        args += ["--proc", "/proc", "--dev", "/dev"]
        if "--size" in self.supports:  # memory a candidate fills there is no process's RSS
            args += ["--size", str(TMPFS_BYTES)]
        args += ["--tmpfs", "/tmp"]
        # First, so that the binds below a folder shown here are made inside it (a project
        # folder and its virtual environment), and after /tmp's tmpfs, which would hide it.
        for source, shown in mounts:
            args += ["--bind", str(source), str(shown)]
        for name in SYSTEM_DIRS:
            if os.path.islink(name):
                args += ["--symlink", os.readlink(name), name]
            elif os.path.isdir(name):
                args += ["--ro-bind", name, name]
        for name in SYSTEM_FILES:
            args += ["--ro-bind-try", name, name]
        for path in interpreter_paths():
            args += ["--ro-bind", str(path), str(path)]
        args += ["--ro-bind", str(PACKAGE_DIR), str(ENGINE_MOUNT / "nearmiss")]
        for path in read_only:
            args += ["--ro-bind", str(path), str(path)]
        if devices:
            args += ["--ro-bind-try", "/sys", "/sys"]
        else:
            # The CPU topology only: libtpu's allocator (TPU targets compile here) aborts
            # without /sys/devices/system/cpu, and thread pools size themselves from it.
            args += ["--ro-bind-try", CPU_TOPOLOGY, CPU_TOPOLOGY]
        if devices:
            for pattern in DEVICE_PATTERNS:
                for node in sorted(glob.glob(pattern)):
                    args += ["--dev-bind", node, node]
            visible = [Path(d) for d in SYSTEM_DIRS] + list(interpreter_paths())
            toolkit = cuda_toolkit()
            if toolkit is not None and not _covered(toolkit, visible):
                args += ["--ro-bind", str(toolkit), str(toolkit)]
            for cuda_home in CUDA_HOMES:
                for target, link in links_to_recreate(cuda_home, visible):
                    args += ["--symlink", target, link]
        # A home the sandbox may not write (``home_writable``) is bound read-only, and only
        # ``writable`` folders in it can be written.
        if not home_writable:
            args += ["--ro-bind", str(home), str(home)]
        for path in (home, *writable) if home_writable else writable:
            args += ["--bind", str(path), str(path)]
        # The sandbox's own root and /dev are tmpfs: read-only, nothing can be hoarded there.
        args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", str(workdir or home)]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        return [*args, "--", *argv]


def seccomp_memfd(program: bytes) -> int:
    """A file descriptor bwrap reads the filter from (it closes it before the child runs)."""
    fd = os.memfd_create("nearmiss-seccomp")  # close-on-exec: inherited only via pass_fds
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


INSTALL_HINT = (
    "install it (`apt-get install bubblewrap`, or `make setup` as root) or pass "
    f"{UNSAFE_FLAG} ({UNSAFE_ENV}=1) to run candidate code unsandboxed"
)


@functools.cache
def _probe(executable: str) -> Bubblewrap | str:
    """Bubblewrap if it runs the interpreter sandboxed here, else why not (one line)."""
    try:
        usage = subprocess.run([executable, "--help"], capture_output=True, text=True, timeout=30)
        supports = frozenset(flag for flag in OPTIONAL_FLAGS if flag in usage.stdout)
        sandbox = Bubblewrap(executable, seccomp_program(), supports)
        with tempfile.TemporaryDirectory(prefix="nearmiss-probe-") as home:
            fd = seccomp_memfd(sandbox.seccomp) if sandbox.seccomp else None
            try:
                env = child_environment(Path(home), {}, engine_path=ENGINE_MOUNT)
                argv = [PYTHON, "-c", "import nearmiss"]
                probe = subprocess.run(
                    sandbox.command(argv, Path(home), env, seccomp_fd=fd),
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    pass_fds=() if fd is None else (fd,),
                )
            finally:
                if fd is not None:
                    os.close(fd)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`{executable}` cannot start a sandbox here ({exc})"
    if probe.returncode != 0:
        lines = (probe.stderr or probe.stdout).strip().splitlines()
        why = lines[-1] if lines else f"exit status {probe.returncode}"
        return f"`{executable}` cannot start a sandbox here ({why})"
    return sandbox


def find_sandbox() -> Bubblewrap | str:
    """The working bubblewrap sandbox, or the one-line reason there is none."""
    executable = shutil.which("bwrap")
    if executable is None:
        return "the bubblewrap sandbox (`bwrap`) is not installed"
    return _probe(executable)


def sandbox_for(trusted: bool) -> Bubblewrap | None:
    """The sandbox a child runs under; None: unsandboxed (the user's opt-out, or a trusted child
    where bwrap is missing). Raises UsageError for untrusted code where there is none."""
    if unsafe_requested():
        if not trusted:
            print(UNSAFE_WARNING, file=sys.stderr, flush=True)
        return None
    found = find_sandbox()
    if isinstance(found, Bubblewrap):
        return found
    if trusted:
        return None
    raise UsageError(f"candidate code runs only sandboxed, and {found}: {INSTALL_HINT}")


def isolation_level() -> str:
    """What contains candidate code: 'bubblewrap+seccomp', 'bubblewrap', each with '+cgroups'
    where the kernel holds every child to its limits (and '+cpu' where each also gets its own
    share of the cores), or 'none (unsafe)' when the user opted out ('none' where no candidate
    could have run)."""
    if unsafe_requested():
        return "none (unsafe)"
    found = find_sandbox()
    if not isinstance(found, Bubblewrap):
        return "none"
    if cgroups.available() is not None:
        return found.level
    return found.level + "+cgroups" + ("+cpu" if cgroups.cpu_shared() else "")
