"""Attack: hoard memory where no process's resident size shows it — files in the sandbox's
tmpfs mounts (/tmp, /dev/shm, its root) — then answer correctly."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
TARGETS = {}  # the test writes {"mb": how much to try} here
CHUNK = b"\xa5" * (16 * 1024 * 1024)


def hoard(folder: str, mb: int) -> str:
    """How many MB went into files under folder, and the error that stopped it."""
    written = 0
    try:
        for index in range(mb // 16):
            with open(os.path.join(folder, f"hoard-{index}"), "wb") as handle:
                handle.write(CHUNK)
            written += 16
    except OSError as exc:
        return f"{written}:{load('errno').errorcode.get(exc.errno, 'OSError')}"
    return f"{written}:ok"


def kernel(x):
    mb = TARGETS.get("mb", 512)
    outcomes = {name: hoard(folder, mb) for name, folder in (("tmp", "/tmp"), ("shm", "/dev/shm"))}
    outcomes["root"] = hoard("/", 16)
    line = "ATTACK " + " ".join(f"{key}={value}" for key, value in outcomes.items())
    print(line, flush=True)
    raise RuntimeError(line)
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
