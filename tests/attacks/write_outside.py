"""Attack: plant files outside the sandbox — the host's /tmp, the project tree, site-packages,
the engine's own package, NEARMISS_HOME — with open() and through a shell."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
TARGETS = {}  # the test writes {name: path} here


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


def plant(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write("planted by an attack\n")


def kernel(x):
    outcomes = {"own": attempt(lambda: plant(os.path.join(os.getcwd(), "mine.txt")))}
    for name, path in TARGETS.items():
        outcomes[name] = attempt(lambda path=path: plant(path))
        shell = os.system(f"mkdir -p \"$(dirname '{path}')\" && echo planted > '{path}.sh'")
        outcomes[name + "_sh"] = "ok" if shell == 0 else "failed"
    tell(outcomes)
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
