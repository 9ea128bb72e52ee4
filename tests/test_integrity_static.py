"""Static integrity rules: cheats are named with rule and line; honest kernels pass."""

from __future__ import annotations

import pytest

from conftest import OPS
from nearmiss.integrity.static import STATIC_RULES, static_violations

CHEATS = {
    "forbidden_import": [
        "import os\nKEY = os.environ.get('OPENAI_API_KEY')\ndef kernel(x):\n    return x\n",
        "import subprocess\ndef kernel(x):\n    return x\n",
        "from socket import create_connection\ndef kernel(x):\n    return x\n",
        "def kernel(x):\n    data = open('/etc/passwd').read()\n    return x\n",
        "def kernel(x):\n    m = __import__('o' + 's')\n    return x\n",
        "def kernel(x):\n    b = kernel.__globals__['__builtins__']\n    return x\n",
        "import importlib\ndef kernel(x):\n    return x\n",
    ],
    "host_callback": [
        "import jax\ndef kernel(x):\n    return jax.pure_callback(f, x, x)\n",
        "from jax.experimental import io_callback\ndef kernel(x):\n    return x\n",
        "import jax\ndef kernel(x):\n    jax.debug.callback(print, x)\n    return x\n",
    ],
    "config_tamper": [
        "import jax\njax.config.update('jax_enable_x64', True)\ndef kernel(x):\n    return x\n",
        "from jax import config\ndef kernel(x):\n    return x\n",
        "from jax.experimental import pallas as pl\ndef kernel(x):\n"
        "    return pl.pallas_call(b, out_shape=x, interpret=True)(x)\n",
    ],
    "exception_fallback": [
        "import jax.numpy as jnp\ndef kernel(x):\n    try:\n        return fast(x)\n"
        "    except Exception:\n        return jnp.exp(x)\n",
        "def kernel(x):\n    try:\n        y = fast(x)\n    except ValueError:\n        y = x\n"
        "    return y\n",
    ],
}
HONEST = [
    # Layout glue around the kernel and ordinary helpers must not be flagged.
    "import functools\nimport math\nimport jax\nimport jax.numpy as jnp\n"
    "from jax.experimental import pallas as pl\n"
    "def kernel(x):\n    n = math.ceil(x.shape[0] / 8) * 8\n"
    "    xp = jnp.pad(x, ((0, n - x.shape[0]), (0, 0))).astype(jnp.float32)\n"
    "    return call(xp)[: x.shape[0]].reshape(x.shape)\n",
    "import jax\ndef kernel(x):\n    jax.debug.print('x {}', x)\n    return x\n",
]


@pytest.mark.parametrize(
    ("rule", "source"),
    [(rule, source) for rule, sources in CHEATS.items() for source in sources],
)
def test_each_cheat_is_named_with_its_rule_and_line(rule, source):
    violations = static_violations(source, "cand.py")
    assert rule in {v.rule for v in violations}
    assert all("cand.py:" in v.detail for v in violations)


def test_every_static_rule_has_at_least_two_cheats():
    assert set(CHEATS) == set(STATIC_RULES)
    assert all(len(sources) >= 2 for sources in CHEATS.values())


@pytest.mark.parametrize("source", HONEST)
def test_honest_glue_is_not_flagged(source):
    assert static_violations(source, "cand.py") == []


def test_no_bundled_kernel_is_flagged():
    cheats = OPS / "integrity" / "cheats"
    kernels = [
        p
        for p in OPS.rglob("*.py")
        if p.name not in ("spec.py", "catalog.py", "verify.py", "__init__.py")
        and not p.is_relative_to(cheats)
    ]
    assert len(kernels) >= 9
    for path in kernels:
        assert static_violations(path.read_text(), path.name) == [], path
