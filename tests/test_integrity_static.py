"""Static integrity rules: cheats are named with rule and line; honest kernels pass."""

from __future__ import annotations

import json

import pytest

from conftest import OPS
from nearmiss.engine.integrity.static import STATIC_RULES, execution_mode_notes, static_violations

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
    ],
    "exception_fallback": [
        "import jax.numpy as jnp\ndef kernel(x):\n    try:\n        return fast(x)\n"
        "    except Exception:\n        return jnp.exp(x)\n",
        "def kernel(x):\n    try:\n        y = fast(x)\n    except ValueError:\n        y = x\n"
        "    return y\n",
    ],
}
# Issue 13: each of these got past the gate (or would have) and reached the OS, files, the
# interpreter, XLA outside the audit, a host callback or JAX's configuration.
BYPASSES = [
    # Issue 13's list.
    ("import typing\nos = typing.sys.modules['os']\n", "forbidden_import"),
    ("import jax\nil = jax._src.xla_bridge.importlib\n", "forbidden_import"),
    ("import numpy as np\nlibc = np.ctypeslib.ctypes.CDLL(None)\n", "forbidden_import"),
    ("import dataclasses\ndataclasses.builtins.exec('1')\n", "forbidden_import"),
    ("import operator\ng = operator.attrgetter('__globals__')(f)\n", "forbidden_import"),
    ("import operator\ng = operator.attrgetter('__glo' + 'bals__')(f)\n", "forbidden_import"),
    ("from operator import methodcaller\nm = methodcaller('mro')\n", "forbidden_import"),
    ("classes = type(0).mro()[-1]\n", "forbidden_import"),
    ("subs = object.__subclasses__()\n", "forbidden_import"),
    ("subs = type.__subclasses__(object)\n", "forbidden_import"),
    ("k = ().__class__.__base__\n", "forbidden_import"),
    ("import functools\nb = functools.__builtins__\n", "forbidden_import"),
    ("import jax.numpy as jnp\nd = jnp.__dict__\n", "forbidden_import"),
    ("import enum\nb = enum.bltns\n", "forbidden_import"),
    ("import collections\ns = collections._sys\n", "forbidden_import"),
    ("import string\nr = string._re\n", "forbidden_import"),
    ("import typing\nc = typing.contextlib.suppress\n", "forbidden_import"),
    ("from dataclasses import sys\n", "forbidden_import"),
    ("import jax\nt = jax._src.test_util\n", "forbidden_import"),
    ("from jax._src import xla_bridge\n", "forbidden_import"),
    ("import jaxlib.xla_client\n", "forbidden_import"),
    ("import jax\nc = jax.lib.xla_client\n", "forbidden_import"),
    # File access through numpy and jax.numpy.
    ("import numpy as np\nw = np.load('w.npy', allow_pickle=True)\n", "forbidden_import"),
    ("import numpy as np\nnp.save('/tmp/x.npy', 1)\n", "forbidden_import"),
    ("import numpy as np\ns = np.fromfile('/etc/shadow', dtype=np.uint8)\n", "forbidden_import"),
    ("import numpy as np\nm = np.memmap('/etc/shadow')\n", "forbidden_import"),
    ("import numpy as np\nt = np.loadtxt('/etc/passwd', dtype=str)\n", "forbidden_import"),
    ("import numpy as np\nt = np.genfromtxt('/etc/passwd')\n", "forbidden_import"),
    ("import numpy as np\nf = np.lib.format.open_memmap\n", "forbidden_import"),
    ("import numpy as np\nv = np.lib.stride_tricks.as_strided\n", "forbidden_import"),
    ("from numpy.lib import npyio\n", "forbidden_import"),
    ("from numpy import load\n", "forbidden_import"),
    ("import numpy\nd = numpy.distutils\n", "forbidden_import"),
    ("import jax.numpy as jnp\nw = jnp.load('w.npy')\n", "forbidden_import"),
    ("import jax\nw = jax.numpy.load('w.npy')\n", "forbidden_import"),
    ("import numpy as np\nm = np\nw = m.load('w.npy')\n", "forbidden_import"),
    ("def kernel(x):\n    x.tofile('/tmp/leak')\n    return x\n", "forbidden_import"),
    ("def kernel(x):\n    x.dump('/tmp/leak')\n    return x\n", "forbidden_import"),
    # Interpreter state: gc, tracing, exit hooks, signals, frames, pickle, codecs.
    ("import jax\ng = jax._src.util.gc\n", "forbidden_import"),
    ("import typing\ntyping.sys.settrace(None)\n", "forbidden_import"),
    ("import dataclasses\ni = dataclasses.inspect.currentframe()\n", "forbidden_import"),
    ("def f(g):\n    return g.atexit.register(print)\n", "forbidden_import"),
    ("def f(m):\n    return m.signal.signal(15, print)\n", "forbidden_import"),
    ("def f(e):\n    return e.__traceback__.tb_frame.f_back.f_globals\n", "forbidden_import"),
    ("def f(g):\n    return g.gi_frame.f_globals\n", "forbidden_import"),
    ("async def f(c):\n    return c.cr_frame\n", "forbidden_import"),
    ("class P:\n    def __reduce__(self):\n        return (print, ())\n", "forbidden_import"),
    ("def f(m):\n    return m.pickle.loads(b'')\n", "forbidden_import"),
    ("def f(m):\n    return m.codecs.open('/etc/passwd')\n", "forbidden_import"),
    ("f = print.__self__.open\n", "forbidden_import"),
    # Attributes and code by computed name.
    (
        "import string\nv = string.Formatter().get_field('0.__class__', [1], {})\n",
        "forbidden_import",
    ),
    ("s = '{0.__class__.__init__.__globals__}'.format(f)\n", "forbidden_import"),
    ("s = '{0.f_globals}'.format(frame)\n", "forbidden_import"),
    ("name = 'glob'\ns = ('{0.__' + name + 'als__}').format(f)\n", "forbidden_import"),
    ("import typing\nh = typing.get_type_hints(f)\n", "forbidden_import"),
    (
        "import functools\n@functools.singledispatch\ndef f(x): ...\n"
        "@f.register\ndef _(x: \"eval('1')\"): ...\n",
        "forbidden_import",
    ),
    ("import typing\ndef g(x: typing.List[\"open('/etc/passwd')\"]): ...\n", "forbidden_import"),
    ("f = getattr\n", "forbidden_import"),
    ("import functools\ng = functools.partial(setattr, obj)\n", "forbidden_import"),
    ("X = type('X', (), {'a': 1})\n", "forbidden_import"),
    ("import dataclasses\nX = dataclasses.make_dataclass('X', ['a'])\n", "forbidden_import"),
    (
        "import jax\njax.tree_util.register_dataclass(T, data_fields=names, meta_fields=[])\n",
        "forbidden_import",
    ),
    ("class A:\n    __array_interface__ = {'data': (0, False)}\n", "forbidden_import"),
    (
        "class A:\n    @property\n    def __array_interface__(self):\n        return {}\n",
        "forbidden_import",
    ),
    ("d = dict(__array_interface__={})\n", "forbidden_import"),
    ("class A:\n    __annotations__ = {'x=1': int}\n", "forbidden_import"),
    ("class A:\n    def __del__(self):\n        pass\n", "forbidden_import"),
    ("import jax.numpy as jnp\njnp.exp = lambda x: x\n", "forbidden_import"),
    ("import jax\ndel jax.nn.softmax\n", "forbidden_import"),
    ("x = 1" + "+1" * 50_000 + "\n", "forbidden_import"),
    # Executables, custom calls and lowerings handed to XLA outside the audit.
    ("import jax\nc = jax.jit(f).lower(x).compile()\n", "forbidden_import"),
    ("from jax.experimental import serialize_executable\n", "forbidden_import"),
    ("import jax\ne = jax.export.deserialize(blob)\n", "forbidden_import"),
    ("import jax\njax.ffi.ffi_call('lapack', out)\n", "forbidden_import"),
    ("from jax.interpreters import mlir\n", "forbidden_import"),
    ("import jax\njax.profiler.start_server(9999)\n", "forbidden_import"),
    ("import jax\njax.distributed.initialize('10.0.0.1:1234')\n", "forbidden_import"),
    ("from jax.experimental import compilation_cache\n", "forbidden_import"),
    # Host callbacks, referenced as well as called.
    ("import jax.experimental.host_callback as hcb\n", "host_callback"),
    (
        "import jax\ndef kernel(x):\n    jax.debug.callback(print, x)\n    return x\n",
        "host_callback",
    ),
    ("import jax\ncb = jax.pure_callback\n", "host_callback"),
    ("import jax\ndef kernel(x):\n    return jax.pure_callback(f, x, x)\n", "host_callback"),
    ("from jax.experimental import io_callback\n", "host_callback"),
    ("import jax\nio = jax.experimental.io_callback\n", "host_callback"),
    ("import jax\njax.debug.breakpoint()\n", "host_callback"),
    # JAX's configuration.
    ("import jax\njax.config.update('jax_enable_x64', True)\n", "config_tamper"),
    ("from jax._src import config\n", "config_tamper"),
    ("import jax\nc = jax._src.config.config\n", "config_tamper"),
    # A precision setting outside a decorator or a `with` item (or with a computed value).
    ("import jax\np = jax.default_matmul_precision\n", "config_tamper"),
    ("import jax\njax.default_matmul_precision('float32').__enter__()\n", "config_tamper"),
    (
        "import jax\n@jax.default_matmul_precision(pick())\ndef kernel(x):\n    return x\n",
        "config_tamper",
    ),
    ("from jax.experimental import enable_x64\n", "config_tamper"),
    ("import jax\nwith jax.experimental.enable_x64():\n    pass\n", "config_tamper"),
    ("import jax\nwith jax.numpy_dtype_promotion('standard'):\n    pass\n", "config_tamper"),
    ("import jax\nwith jax.disable_jit():\n    pass\n", "config_tamper"),
    # Where or how the kernel is traced: a kernel that can tell can be one kernel for the
    # engine and another on the chip (tests/forgeries/target_*.py).
    (
        "from jax.extend import backend\nkind = backend.get_default_device().device_kind\n",
        "config_tamper",
    ),
    ("import jax\non_cpu = jax.default_backend() == 'cpu'\n", "config_tamper"),
    ("import jax\nmesh = jax.sharding.get_abstract_mesh()\n", "config_tamper"),
    (
        "from jax.experimental.pallas.ops.tpu.megablox import common\n"
        "BLOCK = 256 if common.tpu_generation() >= 5 else 128\n",
        "config_tamper",
    ),
    ("from jax.experimental.pallas.ops.tpu.megablox.common import is_tpu\n", "config_tamper"),
    (
        "from jax.experimental.pallas import tpu as pltpu\nm = pltpu.force_tpu_interpret_mode\n",
        "config_tamper",
    ),
    # A second path for the computation.
    (
        "def kernel(x):\n    try:\n        return fast(x)\n    finally:\n        return x\n",
        "exception_fallback",
    ),
    (
        "class Quiet:\n    def __enter__(self):\n        return self\n"
        "    def __exit__(self, *exc):\n        return True\n",
        "exception_fallback",
    ),
]
# As JAX's own kernels write it: literally, through a variable, in functools.partial.
INTERPRET_PASSED = (
    "import functools\nfrom jax.experimental import pallas as pl\ndef kernel(x, interpret=False):\n"
    "    y = pl.pallas_call(b, out_shape=x, interpret=True)(x)\n"
    "    mode = interpret\n    call = functools.partial(pl.pallas_call, interpret=mode)\n"
    "    return call(b, out_shape=x)(y)\n"
)
HONEST = [
    # Layout glue around the kernel and ordinary helpers must not be flagged.
    "import functools\nimport math\nimport jax\nimport jax.numpy as jnp\n"
    "from jax.experimental import pallas as pl\n"
    "def kernel(x):\n    n = math.ceil(x.shape[0] / 8) * 8\n"
    "    xp = jnp.pad(x, ((0, n - x.shape[0]), (0, 0))).astype(jnp.float32)\n"
    "    return call(xp)[: x.shape[0]].reshape(x.shape)\n",
    "import jax\ndef kernel(x):\n    jax.debug.print('x {}', x)\n    return x\n",
    # Idioms of kernels written in JAX's own style (jax/experimental/pallas/ops).
    "import jax\nfrom jax.experimental import pallas as pl\n"
    "def body(x_ref, o_ref):\n    o_ref[...] = pl.load(x_ref, (slice(None),))\n",
    "from jax.experimental.pallas import mosaic_gpu as plgpu\nv = plgpu.load(r, ())\n",
    "import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass B:\n    a: int\n"
    "    def __post_init__(self):\n        object.__setattr__(self, 'b', self.a)\n",
    "class M(Base):\n    def __init__(self, x):\n        super().__init__(x)\n"
    "    def __call__(self, y):\n        return y\n    def __hash__(self):\n        return 1\n"
    "    def __eq__(self, other):\n        return True\n",
    "s = '{} {:.3f} {x!r:>10} {0[1]}'.format(1, 2.0, x=3)\n",
    "import jax\ndef kernel(x):\n    jax.debug.print('x={x} shape={s}', x=x, s=x.shape)\n"
    "    return x\n",
    "if __name__ == '__main__':\n    main()\n",
    "from jax._src import dtypes\nimport jax._src.pallas.primitives as prim\n",
    "import jax\nk = jax._src.dtypes.canonicalize_dtype(jax.numpy.float32)\n",
    "import jax.experimental.pallas.tpu as pltpu\nfrom jax.experimental.pallas import triton\n",
    "import numpy as np\nnp.testing.assert_allclose(np.ones(2), np.ones(2))\n",
    "from __future__ import annotations\nimport typing\n"
    "def f(x: 'jax.Array', y: typing.Optional['int'] = None) -> 'tuple[int, int]': ...\n",
    "import dataclasses\nimport jax\n@jax.tree_util.register_dataclass\n"
    "@dataclasses.dataclass\nclass S:\n    a: jax.Array\n",
    "import jax\njax.tree_util.register_dataclass(S, data_fields=['a'], meta_fields=['b'])\n",
    'def kernel(x):\n    """Softmax rows; see __init__ and __call__."""\n    return x\n',
    "import functools\nimport jax\nfrom jax import lax\n"
    "@functools.partial(jax.jit, static_argnames=['block'])\n"
    "def f(x, block):\n    return lax.fori_loop(0, 4, lambda i, c: c, x)\n",
    "def kernel(x):\n    try:\n        y = x + 1\n    finally:\n        pass\n    return y\n",
    # The engine owns the execution mode: passing it is noted (execution_mode_notes), not cheating.
    INTERPRET_PASSED,
    # Library code (JAX's own kernels): an optional import at module level, json for tables.
    "try:\n    from jax.experimental.pallas import tpu as pltpu\nexcept ImportError:\n"
    "    pltpu = None\n",
    "try:\n    import jax.experimental.pallas.triton as plgpu\n"
    "except (ImportError, ModuleNotFoundError):\n    pass\n",
    "import json\nBLOCKS = json.loads('{\"v5e\": [128, 128]}')\n",
    # A precision choice scoped to one trace (JAX's flash attention decorates its reference).
    "import jax\n@jax.default_matmul_precision('bfloat16')\ndef kernel(x):\n    return x\n",
    "import jax\ndef kernel(x):\n    with jax.default_matmul_precision('float32'):\n"
    "        return x @ x\n",
    # An error reworded and raised again (JAX's splash attention): no other path is taken.
    "def shard(s, n):\n    try:\n        return s.shard_shape(n)\n    except ValueError as exc:\n"
    "        raise ValueError(f'must divide {n}') from exc\n",
    "def f(x):\n    try:\n        return g(x)\n    except (KeyError, IndexError):\n        raise\n",
]
# Near an optional import or a reworded error, but a fallback all the same: still refused.
NOT_AN_OPTIONAL_IMPORT = [
    ("try:\n    import jax\nexcept Exception:\n    jax = None\n", "exception_fallback"),
    (
        "def f():\n    try:\n        import jax\n    except ImportError:\n        pass\n",
        "exception_fallback",
    ),
    (
        "try:\n    import jax\n    y = jax.numpy.ones(3)\nexcept ImportError:\n    y = None\n",
        "exception_fallback",
    ),
    ("try:\n    import jax\nexcept ImportError:\n    y = compute()\n", "exception_fallback"),
    ("try:\n    import os\nexcept ImportError:\n    os = None\n", "forbidden_import"),
    # A handler that raises, but computes first or in what it raises: a second path.
    (
        "def f(x):\n    try:\n        return g(x)\n    except ValueError:\n"
        "        y = fallback(x)\n        raise\n",
        "exception_fallback",
    ),
    (
        "def f(x):\n    try:\n        return g(x)\n    except ValueError:\n"
        "        raise Stop(fallback(x))\n",
        "exception_fallback",
    ),
    (
        "def f(x):\n    try:\n        return g(x)\n    except ValueError:\n"
        "        raise Stop(f'{fallback(x)}')\n",
        "exception_fallback",
    ),
    (
        "def f(x):\n    try:\n        return g(x)\n    except ValueError:\n        raise\n"
        "    except KeyError:\n        return x\n",
        "exception_fallback",
    ),
    ("import json\nwith open('x') as f:\n    t = json.load(f)\n", "forbidden_import"),
]


@pytest.mark.parametrize(("source", "rule"), NOT_AN_OPTIONAL_IMPORT)
def test_a_fallback_dressed_as_library_code_is_still_refused(source, rule):
    assert rule in {v.rule for v in static_violations(source, "cand.py")}


def test_an_interpret_flag_is_noted_where_it_is_passed():
    assert execution_mode_notes(INTERPRET_PASSED, "cand.py") == [
        f"`interpret=` passed to `{call}` at cand.py:{line}: the engine sets the execution mode "
        "itself (interpret on CPU, the chip's compiler for a target)"
        for call, line in (("pl.pallas_call", 4), ("functools.partial", 6))
    ]
    assert execution_mode_notes("def kernel(x:\n", "cand.py") == []


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


@pytest.mark.parametrize(
    ("source", "rule"), BYPASSES, ids=[f"{i}-{r}" for i, (_, r) in enumerate(BYPASSES)]
)
def test_each_bypass_is_refused_with_its_rule(source, rule):
    violations = static_violations(source, "cand.py")
    assert rule in {v.rule for v in violations}, violations
    assert all(" at cand.py:" in v.detail for v in violations)


def test_bypasses_cover_every_static_rule():
    assert {rule for _, rule in BYPASSES} == set(STATIC_RULES)


def test_violations_come_in_line_order_with_the_gates_messages():
    source = (
        "import os\nimport jax\ndef kernel(x):\n    y = jax.pure_callback(f, x, x)\n"
        "    return kernel.__globals__\n"
    )
    assert [v.detail for v in static_violations(source, "cand.py")] == [
        "import of `os` at cand.py:1",
        "host callback `jax.pure_callback()` at cand.py:4",
        "interpreter internals `__globals__` at cand.py:5",
    ]


def test_a_syntax_error_is_left_to_the_sandbox():
    assert static_violations("def kernel(x:\n", "cand.py") == []


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


def test_a_cheat_labelled_with_a_dynamic_rule_is_still_executed():
    # The dynamic rules can only catch what runs: the static gate must not block these.
    root = OPS / "integrity"
    for entry in json.loads((root / "manifest.json").read_text()):
        if entry["rule"] is None or entry["rule"] in STATIC_RULES:
            continue
        path = root / entry["file"]
        rules = {v.rule for v in static_violations(path.read_text(), path.name)}
        assert "forbidden_import" not in rules, path


# Edits the search makes of a module are small and many: ``EditScan`` scans each where it
# differs. Its findings must be the whole scan's, for honest edits and for edits that bring in
# what the rules refuse (a forbidden name, a callback, the config, an import, a try).
_INSERTS = [
    "__import__('os')",
    "getattr(jnp, 'exp')",
    "jax.config",
    "jax.pure_callback",
    "eval",
    "x.__class__",
    "jax.numpy",
    "0.5",
]


def _edits(source: str, rng) -> list[str]:
    """Single-site text edits of ``source``: a name, an attribute or a constant replaced by
    one of ``_INSERTS``; a statement joined by ``; import os``; a line added; a try put in."""
    import ast

    lines = source.splitlines(keepends=True)
    nodes = [
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Name | ast.Attribute | ast.Constant) and n.lineno == n.end_lineno
    ]
    edits = []
    for node in rng.sample(nodes, min(40, len(nodes))):
        line = lines[node.lineno - 1]
        insert = rng.choice(_INSERTS)
        edited = line[: node.col_offset] + insert + line[node.end_col_offset :]
        edits.append("".join(lines[: node.lineno - 1] + [edited] + lines[node.lineno :]))
    for number in rng.sample(range(len(lines)), min(12, len(lines))):
        line = lines[number].rstrip("\n")
        joined = line + "; import os\n" if line.strip() else line + "\n"
        added = lines[number] + " " * (len(line) - len(line.lstrip())) + "y = eval\n"
        indent = line[: len(line) - len(line.lstrip())]
        tried = f"{indent}try:\n{indent}    pass\n{indent}except Exception:\n{indent}    pass\n"
        for replacement in (joined, added, tried if line.strip() else lines[number]):
            edits.append("".join(lines[:number] + [replacement] + lines[number + 1 :]))
    return edits


@pytest.mark.parametrize("op", ["softmax_rows", "flash_attention", "matmul"])
def test_an_edit_scanned_where_it_differs_gets_the_findings_of_the_whole_scan(op):
    import random

    from nearmiss.engine.integrity.static import EditScan

    path = OPS / op / "golden.py"
    source = path.read_text()
    scan = EditScan(source, path.name)
    assert scan.segments, "the golden parses: its statements are known"
    refused = 0
    for edited in _edits(source, random.Random(op)):
        expected = static_violations(edited, path.name)
        assert scan.violations(edited) == expected, edited
        refused += bool(expected)
    assert refused >= 20  # the edits did bring in what the rules refuse


def test_an_edit_of_a_module_that_does_not_parse_is_scanned_whole():
    from nearmiss.engine.integrity.static import EditScan

    scan = EditScan("def kernel(x:\n    return x\n", "k.py")
    edited = "import os\ndef kernel(x):\n    return os.environ\n"
    assert scan.violations(edited) == static_violations(edited, "k.py") != []


def test_an_edit_that_removes_a_finding_or_adds_an_import_name_is_scanned_as_a_whole_would():
    from nearmiss.engine.integrity.static import EditScan

    source = (
        "import jax.numpy as jnp\n\n\n"
        "def helper(x):\n    return getattr(x, 'T')\n\n\n"
        "def kernel(x):\n    return lib.config\n"
    )
    scan = EditScan(source, "k.py")
    assert [v.rule for v in scan.violations(source)] == ["forbidden_import"]
    # The finding's own statement edited away: gone; another statement edited: it stays.
    fixed = source.replace("getattr(x, 'T')", "x.T")
    assert scan.violations(fixed) == static_violations(fixed, "k.py") == []
    elsewhere = source.replace("return lib.config", "return lib.configs")
    assert scan.violations(elsewhere) == static_violations(elsewhere, "k.py") != []
    # An import put into one statement names a module the other statements read.
    imported = source.replace("    return getattr(x, 'T')", "    import jax as lib; return x.T")
    expected = static_violations(imported, "k.py")
    assert "config_tamper" in {v.rule for v in expected}
    assert scan.violations(imported) == expected
