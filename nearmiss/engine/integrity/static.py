"""Static integrity rules, read from the candidate's source before any of it executes.

The static gate is a fast first refusal, not the wall: the sandbox contains what gets past it,
and the verdict comes from places the candidate cannot reach. It refuses, cheaply and with a
line number, what an honest kernel never needs.

A kernel needs JAX, NumPy and a little of the standard library; anything that reaches the
operating system, the network, files, the interpreter's internals or JAX's configuration is a
way to subvert the engine, and a ``try/except`` gives the computation a second path the suite
may never exercise. Beyond the import allowlist, the rules are about *names*, whatever object
they are read from, because Python hands out modules and frames through attributes:

- ``forbidden_import``: imports outside the allowlist; attributes that lead to the interpreter
  or the OS (``typing.sys``, ``dataclasses.builtins``, ``np.ctypeslib.ctypes``, frames:
  ``tb_frame``, ``f_globals``, ``gi_frame``...); every dunder except a short list of harmless
  ones (``__name__``, ``__init__``, operators...), as an attribute, a name, a keyword, a
  definition or inside a string; private modules (``jax._src`` outside an allowlist of pure
  computation modules, ``jaxlib`` outside ``jaxlib.mlir``, ``string._re``...); attribute access
  by computed name (``getattr``, ``vars``, ``operator.attrgetter``, ``str.format`` on a computed
  format string, ``string.Formatter``, ``typing.get_type_hints``, three-argument ``type``...);
  file access through NumPy or JAX (``np.load``, ``np.fromfile``, ``x.tofile``, ``np.memmap``,
  ``np.lib``...); executables and lowerings built outside the engine (``.compile()``,
  ``serialize_executable``, ``jax.ffi``...); patching an imported module; code in string
  annotations (``typing.get_type_hints`` and ``functools.singledispatch`` evaluate them);
- ``host_callback``: ``pure_callback``, ``io_callback``, ``jax.debug.callback``... referenced,
  not only called;
- ``config_tamper``: ``jax.config``, JAX's configuration context managers (``enable_x64``...;
  ``jax.default_matmul_precision`` too, except as a decorator or ``with`` item with constant
  arguments, where it only sets the precision of what is traced under it), the questions that
  tell where a kernel is traced (``jax.default_backend``, ``get_abstract_mesh``,
  ``force_tpu_interpret_mode``...);
- ``exception_fallback``: ``try/except`` (except a module-level optional import, and handlers
  that only raise again), a ``finally`` that returns, a context manager of the candidate's own
  (its ``__exit__`` can swallow the failure).

Each violation names its rule, what was found and the line. The scan is iterative
(``ast.walk``): a deeply nested source cannot crash it, and a source too deep to parse is
refused rather than waved through.
"""

from __future__ import annotations

import ast
import re
import string

from nearmiss.engine.inputs import parse_source
from nearmiss.engine.models import Violation

ALLOWED_MODULES = frozenset(
    {
        "__future__",
        "jax",
        "jaxlib",
        "numpy",
        "ml_dtypes",
        "math",
        "functools",
        "itertools",
        "typing",
        "dataclasses",
        "collections",
        "operator",
        "enum",
        "abc",
        "numbers",
        "string",
        "json",  # JAX's kernels read configuration tables with it (json.load/dump stay refused)
    }
)
# Builtins that reach code, files or attributes by name: refused wherever they are referenced
# (``f = getattr`` is as good as a call).
FORBIDDEN_BUILTINS = frozenset(
    {
        "open",
        "eval",
        "exec",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
        "breakpoint",
        "help",
        "license",
        "credits",
        "copyright",
    }
)
# Builtins refused when called (harmless as values).
FORBIDDEN_CALLS = FORBIDDEN_BUILTINS | {"input", "exit", "quit"}
CALLBACK_NAMES = frozenset({"pure_callback", "io_callback", "host_callback", "callback"})
# Callback entry points, whatever they are read from.
HOST_CALLBACKS = frozenset(
    {"pure_callback", "io_callback", "host_callback", "buffer_callback", "debug_callback"}
)
# Dunders an honest kernel reads, defines or names: the rest lead to the interpreter's
# internals (``__globals__``, ``__subclasses__``, ``__dict__``, ``__self__``...), or give the
# engine's own code a hook into the candidate (``__array_interface__`` is raw memory access,
# ``__reduce__`` is pickle, ``__del__`` runs after the verdict).
HARMLESS_DUNDERS = frozenset(
    {
        "__name__",
        "__qualname__",
        "__doc__",
        "__module__",
        "__file__",
        "__all__",
        "__version__",
        "__slots__",
        "__main__",
        "__future__",
        "__debug__",
        "__init__",
        "__post_init__",
        "__new__",
        "__call__",
        "__repr__",
        "__str__",
        "__hash__",
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__bool__",
        "__len__",
        "__iter__",
        "__next__",
        "__reversed__",
        "__contains__",
        "__getitem__",
        "__setitem__",
        "__enter__",
        "__neg__",
        "__pos__",
        "__abs__",
        "__invert__",
        "__round__",
        "__floor__",
        "__ceil__",
        "__trunc__",
        "__index__",
        "__int__",
        "__float__",
        "__complex__",
        "__array__",
        "__array_priority__",
        "__jax_array__",
        "__wrapped__",
    }
    | {
        f"__{prefix}{op}__"
        for op in (
            "add",
            "sub",
            "mul",
            "matmul",
            "truediv",
            "floordiv",
            "mod",
            "divmod",
            "pow",
            "lshift",
            "rshift",
            "and",
            "or",
            "xor",
        )
        for prefix in ("", "r", "i")
    }
)
# Attribute names that lead to the interpreter or the operating system, whatever object they
# are read from: modules re-exported as attributes (``typing.sys``, ``dataclasses.builtins``,
# ``enum.bltns``, ``np.ctypeslib.ctypes``, ``jax._src.xla_bridge.importlib``), the functions
# that matter in them, frames and code objects, and attribute access by computed name.
INTERPRETER_NAMES = frozenset(
    {
        # modules
        "sys",
        "_sys",
        "builtins",
        "bltns",
        "importlib",
        "imp",
        "ctypes",
        "ctypeslib",
        "os",
        "posix",
        "nt",
        "subprocess",
        "shutil",
        "socket",
        "pickle",
        "_pickle",
        "cPickle",
        "marshal",
        "copyreg",
        "codecs",
        "inspect",
        "gc",
        "atexit",
        "signal",
        "threading",
        "_thread",
        "multiprocessing",
        "asyncio",
        "traceback",
        "linecache",
        "pydoc",
        "runpy",
        "site",
        "contextlib",
        "types",
        "warnings",
        "logging",
        "tempfile",
        "pathlib",
        "mmap",
        "resource",
        "fcntl",
        "urllib",
        "http",
        "_string",
        "distutils",
        "f2py",
        "extbuild",
        "ifrt_proxy",
        # functions of those modules re-exported elsewhere
        "system",
        "popen",
        "environ",
        "getenv",
        "putenv",
        "import_module",
        "settrace",
        "setprofile",
        "_getframe",
        "exc_info",
        "get_objects",
        "get_referrers",
        "get_referents",
        # frames and code
        "tb_frame",
        "tb_next",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_back",
        "f_code",
        "f_trace",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "cr_code",
        "ag_frame",
        "ag_code",
        "co_code",
        "mro",
        # raw memory
        "as_strided",
    }
)
# Attribute access, or code, by computed name.
COMPUTED_NAMES = frozenset(
    {
        "attrgetter",
        "methodcaller",
        "Formatter",
        "get_field",
        "vformat",
        "get_type_hints",
        "ForwardRef",
        "_eval_type",
        "_evaluate",
        "make_dataclass",
    }
)
# Executables, lowerings and custom calls built outside the engine's audit (XLA runs them, no
# trace shows the work).
EXECUTABLE_NAMES = frozenset(
    {
        "compile",
        "compile_and_load",
        "runtime_executable",
        "serialize_executable",
        "deserialize_and_load",
        "deserialize",
        "compilation_cache",
        "xla_bridge",
        "xla_client",
        "xla_extension",
        "_xla",
        "ffi",
        "ffi_call",
        "register_ffi_target",
        "pycapsule",
        "register_lowering",
        "lower_fun",
        "def_impl",
        "colocated_python",
        "array_serialization",
    }
)
# File access through NumPy, JAX or an array, whatever object it is read from.
FILE_NAMES = frozenset(
    {
        "fromfile",
        "tofile",
        "memmap",
        "open_memmap",
        "fromregex",
        "loadtxt",
        "genfromtxt",
        "savetxt",
        "savez",
        "savez_compressed",
        "DataSource",
        "dump",
        "read_array",
        "write_array",
        "npyio",
        "save_device_memory_profile",
        "start_trace",
    }
)
# NumPy's file and introspection entry points: refused on numpy / jax.numpy, and on any object
# the gate cannot tell apart from them (``pl.load`` is Pallas's, and fine).
NUMPY_FILE_NAMES = frozenset({"load", "save", "lib"})
NUMPY_ONLY_NAMES = frozenset({"info", "source", "lookfor", "who", "show_config", "show_runtime"})
NUMPY_MODULES = ("numpy", "jax.numpy")
# JAX's configuration states (``jax.<name>`` context managers and ``jax.config``).
CONFIG_NAMES = frozenset(
    {
        "enable_x64",
        "disable_x64",
        "x64_context",
        "default_matmul_precision",
        "numpy_dtype_promotion",
        "numpy_rank_promotion",
        "default_prng_impl",
        "default_device",
        "debug_nans",
        "debug_infs",
        "debug_key_reuse",
        "disable_jit",
        "log_compiles",
        "enable_checks",
        "check_tracer_leaks",
        "checking_leaks",
        "explain_cache_misses",
        "transfer_guard",
        "transfer_guard_host_to_device",
        "transfer_guard_device_to_device",
        "transfer_guard_device_to_host",
        "softmax_custom_jvp",
        "threefry_partitionable",
        "legacy_prng_key",
        "enable_custom_prng",
        "allow_f16_reductions",
        "no_tracing",
        "no_execution",
        "array_garbage_collection_guard",
        "config_with_absl",
        "update_thread_local_jit_state",
    }
)
# Settings that only fix how the operations traced under them compute, written into the traced
# program itself (``jax.default_matmul_precision("float32")`` sets each dot's ``precision``): as a
# decorator or a ``with`` item, with constant arguments, they are the kernel's own choice, as
# ``precision=`` is, and every artifact of the one trace carries them. JAX's flash attention
# decorates its reference helper this way. Anywhere else, they are configuration.
SCOPED_CONFIG_NAMES = frozenset({"default_matmul_precision"})
# Names that tell a kernel where, or in which mode, it is being traced (the backend, the
# devices, the chip, the abstract mesh the engine lowers a TPU target under, the Pallas
# interpreter's settings). A kernel whose meaning depends on them can show the engine one kernel
# and the chip another (tests/forgeries/target_*.py): the engine alone chooses where it runs.
PLATFORM_NAMES = frozenset(
    {
        "default_backend",
        "devices",
        "local_devices",
        "device_count",
        "local_device_count",
        "get_backend",
        "backends",
        "device_kind",
        "get_abstract_mesh",
        "get_concrete_mesh",
        "use_abstract_mesh",
        "abstract_device",
        "get_tpu_info",
        "get_tpu_info_for_chip",
        # Asks by staging a branch per platform: JAX's lowering keeps the one it lowers for.
        "platform_dependent",
        "platform_index",
        # JAX's kernels' own helpers for the same question (ops/tpu/megablox/common.py).
        "is_tpu",
        "tpu_kind",
        "tpu_generation",
        "is_tpu_device",
        "force_tpu_interpret_mode",
        "set_tpu_interpret_mode",
        "reset_tpu_interpret_mode_state",
        "pallas_tpu_interpret_mode_context_manager",
        # What else the process holds while the kernel is traced: a user's ``jax.jit(kernel)(x)``
        # has ``x`` alive, the engine's trace of shapes has no array at all, so a kernel that
        # asked ``jax.live_arrays()`` was right under the engine and wrong for every user (and
        # read the user's input values at trace time; found 2026-12-05 by an attack review).
        "live_arrays",
        "live_buffers",
        "memory_stats",
        "device_memory_profile",
        "unsafe_buffer_pointer",
    }
)
# Modules (and names) by full dotted path, as imported or as reached through an import alias.
PATH_RULES = (
    ("jax.config", "config_tamper"),
    ("jax._src.config", "config_tamper"),
    ("jax.experimental.host_callback", "host_callback"),
    ("jax.experimental.io_callback", "host_callback"),
    ("jax.experimental.buffer_callback", "host_callback"),
    ("jax.pure_callback", "host_callback"),
    ("jax.debug.callback", "host_callback"),
    ("jax.debug.breakpoint", "host_callback"),
    ("jax.lib", "forbidden_import"),
    ("jax.interpreters", "forbidden_import"),
    ("jax.extend", "forbidden_import"),
    ("jax.ffi", "forbidden_import"),
    ("jax.profiler", "forbidden_import"),
    ("jax.distributed", "forbidden_import"),
    ("jax.tools", "forbidden_import"),
    ("jax.experimental.compilation_cache", "forbidden_import"),
    ("jax.experimental.serialize_executable", "forbidden_import"),
    ("jax.experimental.jax2tf", "forbidden_import"),
    ("jax.experimental.colocated_python", "forbidden_import"),
    ("jax.experimental.array_serialization", "forbidden_import"),
    ("jax.experimental.transfer", "forbidden_import"),
    ("jax.experimental.profiler", "forbidden_import"),
    ("jaxlib", "forbidden_import"),
    ("numpy.testing.extbuild", "forbidden_import"),
) + tuple(
    (f"{module}.{name}", "forbidden_import")
    for module in NUMPY_MODULES
    for name in sorted(NUMPY_FILE_NAMES | NUMPY_ONLY_NAMES | {"ctypeslib", "distutils", "f2py"})
)
# Below these, private modules and the rules above do not apply: JAX's pure computation
# internals that kernels written in JAX's own style import, and MLIR for kernels written at
# that level.
ALLOWED_PREFIXES = ("jax.extend.backend", "jaxlib.mlir") + tuple(
    f"jax._src.{name}"
    for name in (
        "core",
        "dtypes",
        "util",
        "shard_map",
        "source_info_util",
        "random",
        "prng",
        "lax",
        "pallas",
        "state",
        "ad_checkpoint",
        "ad_util",
        "numpy",
        "typing",
        "tree_util",
        "custom_derivatives",
        "mesh",
        "sharding",
        "sharding_impls",
        "named_sharding",
        "partition_spec",
    )
)
STATIC_RULES = ("forbidden_import", "host_callback", "config_tamper", "exception_fallback")
_DUNDER_IN_TEXT = re.compile(r"(?<![A-Za-z0-9])__[A-Za-z][A-Za-z0-9_]*?__(?![A-Za-z0-9])")
_FIELD_ATTRIBUTE = re.compile(r"\.([^.]+)")
_FIELD_INDEX = re.compile(r"\[[^\]]*\]")
_MAX_ANNOTATION_DEPTH = 3


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _allowed(path: str) -> bool:
    return any(_under(path, prefix) for prefix in ALLOWED_PREFIXES)


def _dotted(node: ast.AST) -> str:
    """'jax.config.update' for an attribute chain, '' when it is not a plain chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _chain(node: ast.Attribute) -> tuple[ast.AST, list[str]]:
    """(root, attribute names from the root outwards) of an attribute chain."""
    parts = []
    current: ast.AST = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    return current, parts[::-1]


def _root_text(node: ast.AST, depth: int = 0) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if depth < 4 and isinstance(node, ast.Attribute):
        return f"{_root_text(node.value, depth + 1)}.{node.attr}"
    if depth < 4 and isinstance(node, ast.Call):
        return f"{_root_text(node.func, depth + 1)}(...)"
    if depth < 4 and isinstance(node, ast.Subscript):
        return f"{_root_text(node.value, depth + 1)}[...]"
    if isinstance(node, ast.Constant):
        return repr(node.value)[:20]
    return "(...)"


def _name_reason(name: str) -> tuple[str, str] | None:
    """(rule, reason) when an attribute (or imported) name is refused wherever it is read."""
    if _is_dunder(name) and name not in HARMLESS_DUNDERS:
        return "forbidden_import", f"interpreter internals `{name}`"
    if name in INTERPRETER_NAMES:
        return "forbidden_import", f"`{name}` reaches the interpreter or the operating system"
    if name in COMPUTED_NAMES:
        return "forbidden_import", f"`{name}` reaches attributes or code by computed name"
    if name in EXECUTABLE_NAMES:
        return "forbidden_import", f"`{name}` runs work outside the engine's audit"
    if name in FILE_NAMES:
        return "forbidden_import", f"`{name}` reads or writes files"
    if name in HOST_CALLBACKS:
        return "host_callback", f"host callback `{name}`"
    if name in CONFIG_NAMES:
        return "config_tamper", f"`{name}` changes JAX's configuration"
    if name in PLATFORM_NAMES:
        return "config_tamper", f"`{name}` asks where or how the kernel runs; the engine decides"
    return None


def _path_reasons(path: str) -> list[tuple[str, str]]:
    """(rule, reason) for a full dotted path (an import, or an attribute chain rooted at an
    import alias)."""
    found = []
    allowed = _allowed(path)
    for prefix, rule in PATH_RULES:
        if _under(path, prefix) and not (allowed and rule == "forbidden_import"):
            found.append((rule, f"`{prefix}` is beyond what a kernel may use"))
            break
    segments = path.split(".")
    if segments[0] in ("jax", "jaxlib") and "config" in segments[1:] and not found:
        found.append(("config_tamper", f"`{path}`"))
    if not allowed and not found:
        private = [s for s in segments if s.startswith("_") and not _is_dunder(s)]
        if private:
            found.append(("forbidden_import", f"private module `{path}`"))
    return found


class _Scanner:
    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.violations: list[tuple[int, Violation]] = []
        self.seen: set[tuple[str, str]] = set()
        self.aliases: dict[str, str] = {}
        self.parents: dict[ast.AST, ast.AST] = {}
        self.offset = 0

    def flag(self, rule: str, node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", None)
        line = line + self.offset if line is not None else None
        where = f"{self.filename}:{line if line is not None else '?'}"
        key = (rule, f"{what} at {where}")
        if key not in self.seen:
            self.seen.add(key)
            self.violations.append((line or 0, Violation(rule=rule, detail=key[1])))

    # -- the whole tree --------------------------------------------------------------------

    def scan(self, tree: ast.AST, depth: int = 0) -> None:
        nodes = list(ast.walk(tree))
        for node in nodes:
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    self.aliases[bound] = alias.name if alias.asname else bound
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for node in nodes:
            handler = getattr(self, f"visit_{type(node).__name__}", None)
            if handler is not None:
                handler(node)
            if depth < _MAX_ANNOTATION_DEPTH:
                for annotation in _annotations(node):
                    self._scan_string_annotations(annotation, depth)

    def _scan_string_annotations(self, annotation: ast.AST, depth: int) -> None:
        """String annotations are code: ``typing.get_type_hints`` and
        ``functools.singledispatch`` evaluate them, so they get the rules of code."""
        for node in ast.walk(annotation):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):  # _is_text
                try:
                    inner = parse_source(node.value.strip(), self.filename, mode="eval")
                except (SyntaxError, ValueError):
                    continue
                except (RecursionError, MemoryError):
                    self.flag("forbidden_import", node, "an annotation too deep to read")
                    continue
                saved = self.offset
                self.offset = saved + node.lineno - 1
                try:
                    self.scan(inner, depth + 1)
                    if depth + 1 < _MAX_ANNOTATION_DEPTH:  # a string within the string
                        self._scan_string_annotations(inner, depth + 1)
                    elif any(_is_text(n) for n in ast.walk(inner)):
                        self.flag("forbidden_import", node, "string annotations nested too deep")
                finally:
                    self.offset = saved

    # -- imports ---------------------------------------------------------------------------

    def _check_path(self, node: ast.AST, path: str, what: str) -> None:
        for segment in path.split(".")[1:]:
            if segment == "*":
                continue
            reason = _name_reason(segment)
            if reason:
                self.flag(reason[0], node, what)
        for rule, _ in _path_reasons(path):
            self.flag(rule, node, what)

    def _check_module(self, node: ast.AST, module: str) -> None:
        root = module.split(".")[0]
        if root not in ALLOWED_MODULES:
            self.flag("forbidden_import", node, f"import of `{module}`")
            return
        self._check_path(node, module, f"import of `{module}`")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
            if alias.asname and _is_dunder(alias.asname):
                self.flag("forbidden_import", node, f"interpreter internals `{alias.asname}`")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.flag("forbidden_import", node, "a relative import")
            return
        module = node.module or ""
        root = module.split(".")[0]
        if root not in ALLOWED_MODULES:
            self.flag("forbidden_import", node, f"import of `{module}`")
            return
        for segment in module.split(".")[1:]:
            reason = _name_reason(segment)
            if reason:
                self.flag(reason[0], node, f"import of `{module}`")
        for alias in node.names:
            if alias.name in CALLBACK_NAMES:
                self.flag("host_callback", node, f"import of `{module}.{alias.name}`")
            if alias.name == "config" and root == "jax":
                self.flag("config_tamper", node, f"import of `{module}.config`")
            if module != "__future__":
                path = module if alias.name == "*" else f"{module}.{alias.name}"
                self._check_path(node, path, f"import of `{path}`")
            if alias.asname and _is_dunder(alias.asname):
                self.flag("forbidden_import", node, f"interpreter internals `{alias.asname}`")

    # -- names and attributes --------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> None:
        parent = self.parents.get(node)
        called = isinstance(parent, ast.Call) and parent.func is node
        if _is_dunder(node.id) and node.id not in HARMLESS_DUNDERS:
            self.flag("forbidden_import", node, f"interpreter internals `{node.id}`")
        elif called and node.id in FORBIDDEN_CALLS:
            self.flag("forbidden_import", node, f"call of `{node.id}()`")
        elif isinstance(node.ctx, ast.Load) and node.id in FORBIDDEN_BUILTINS:
            self.flag("forbidden_import", node, f"reference to `{node.id}`")
        if called and node.id in CALLBACK_NAMES and node.id != "callback":
            self.flag("host_callback", node, f"host callback `{node.id}()`")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parent = self.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # the outermost attribute of a chain checks the whole chain
        root, parts = _chain(node)
        called = isinstance(parent, ast.Call) and parent.func is node
        plain = f"{_root_text(root)}.{'.'.join(parts)}"
        text = plain + ("()" if called else "")
        resolved = (
            ".".join([self.aliases[root.id], *parts])
            if isinstance(root, ast.Name)
            and root.id in self.aliases
            and self.aliases[root.id].split(".")[0] in ALLOWED_MODULES
            else None
        )
        flagged: set[str] = set()

        def flag(rule: str, what: str) -> None:
            if rule not in flagged:
                flagged.add(rule)
                self.flag(rule, node, what)

        for index, name in enumerate(parts):
            if name == "__setattr__" and _frozen_dataclass_setattr(parent, node, index, parts):
                continue
            if name in SCOPED_CONFIG_NAMES and self._scoped_setting(node, parent, called):
                continue
            reason = _name_reason(name)
            if reason:
                rule, why = reason
                if rule == "forbidden_import" and why.startswith("interpreter internals"):
                    flag(rule, why)  # the message the gate has always given
                elif rule == "host_callback":
                    flag(rule, f"host callback `{text}`")
                elif rule == "config_tamper":
                    flag(rule, f"`{plain}`")
                else:
                    flag(rule, f"`{text}`: {why}")
            before = parts[index - 1] if index else None
            if name == "callback" and (called and index == len(parts) - 1 or before == "debug"):
                flag("host_callback", f"host callback `{text}`")
            if name == "breakpoint" and before == "debug":
                flag("host_callback", f"host callback `{text}`")
            if name in NUMPY_FILE_NAMES:
                # np.load / jnp.load, or an object that may be numpy: refused; pl.load is not
                base = resolved and ".".join(resolved.split(".")[: -len(parts) + index or None])
                if not base or base in NUMPY_MODULES:
                    flag("forbidden_import", f"`{text}`: `{name}` of NumPy reads or writes files")
        if resolved is not None:
            for rule, why in _path_reasons(resolved):
                if rule == "forbidden_import":
                    flag(rule, f"`{text}`: {why}")
                elif rule == "host_callback":
                    flag(rule, f"host callback `{text}`")
                else:
                    flag(rule, f"`{plain}`")
            if not isinstance(node.ctx, ast.Load):
                flag("forbidden_import", f"assignment to `{text}` patches an imported module")
        elif _dotted(node).startswith("jax.config"):
            flag("config_tamper", f"`{_dotted(node)}`")

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg and _is_dunder(node.arg) and node.arg not in HARMLESS_DUNDERS:
            self.flag("forbidden_import", node, f"interpreter internals `{node.arg}`")

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        for name in node.names:
            if _is_dunder(name) and name not in HARMLESS_DUNDERS:
                self.flag("forbidden_import", node, f"interpreter internals `{name}`")

    visit_Nonlocal = visit_Global

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, str):
            return
        for name in _DUNDER_IN_TEXT.findall(node.value):
            if name not in HARMLESS_DUNDERS:
                self.flag("forbidden_import", node, f"interpreter internals `{name}` in a string")
        for name in _format_attributes(node.value):
            reason = _name_reason(name)
            if reason and reason[0] == "forbidden_import":
                self.flag("forbidden_import", node, f"format field reaching `.{name}` in a string")

    # -- calls -----------------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        last = name.rsplit(".", 1)[-1] if name else ""
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("format", "format_map"):
            receiver = func.value
            if not (isinstance(receiver, ast.Constant) and isinstance(receiver.value, str)):
                self.flag(
                    "forbidden_import",
                    node,
                    f"`{_root_text(func)}()` on a computed format string "
                    "(format fields read attributes by name)",
                )
        if name == "type" and len(node.args) == 3:
            self.flag("forbidden_import", node, "a class built by `type()` from computed names")
        if last == "register_dataclass":
            fields = list(node.args[1:3]) + [
                k.value for k in node.keywords if k.arg in ("data_fields", "meta_fields")
            ]
            if not all(_literal_names(f) for f in fields):
                self.flag(
                    "forbidden_import",
                    node,
                    f"`{name or 'register_dataclass'}()` with computed field names "
                    "(reads attributes by name)",
                )

    # -- definitions -----------------------------------------------------------------------

    def visit_FunctionDef(
        self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    ) -> None:
        if node.name in ("__exit__", "__aexit__"):
            self.flag(
                "exception_fallback",
                node,
                f"a context manager's `{node.name}` can swallow a failure "
                "and switch to another path",
            )
        elif _is_dunder(node.name) and node.name not in HARMLESS_DUNDERS:
            self.flag("forbidden_import", node, f"interpreter internals `{node.name}` defined")

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_ClassDef = visit_FunctionDef

    def _scoped_setting(self, node: ast.AST, parent: ast.AST | None, called: bool) -> bool:
        """``node`` (a ``SCOPED_CONFIG_NAMES`` attribute) called with constant arguments as a
        decorator or a ``with`` item: the setting applies to that trace only."""
        if not called or not isinstance(parent, ast.Call) or parent.keywords:
            return False
        if not all(isinstance(arg, ast.Constant) for arg in parent.args):
            return False
        holder = self.parents.get(parent)
        if isinstance(holder, ast.FunctionDef | ast.AsyncFunctionDef):
            return parent in holder.decorator_list
        return isinstance(holder, ast.withitem) and holder.context_expr is parent

    def visit_Try(self, node: ast.Try) -> None:
        if node.handlers and not self._optional_import(node) and not _only_reraises(node):
            self.flag(
                "exception_fallback",
                node,
                "try/except around the computation: a failure "
                "must surface, not switch to another path",
            )
        if any(_leaves(statement) for statement in node.finalbody):
            self.flag(
                "exception_fallback",
                node,
                "a `finally` that returns or jumps swallows the failure",
            )

    visit_TryStar = visit_Try

    def _optional_import(self, node: ast.Try) -> bool:
        """A module-level ``try: import X / except ImportError: X = None`` (library code's
        optional dependency): it cannot switch the computation on a failure of the kernel, its
        imports are judged like any other, and a path taken without the module is judged by
        the dynamic rules like any computation."""
        if not isinstance(self.parents.get(node), ast.Module) or node.orelse or node.finalbody:
            return False
        if not all(isinstance(s, ast.Import | ast.ImportFrom) for s in node.body):
            return False
        for handler in node.handlers:
            caught = handler.type
            names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
            if not names or not all(
                isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError")
                for n in names
            ):
                return False
            for statement in handler.body:
                simple = isinstance(statement, ast.Pass | ast.Import | ast.ImportFrom) or (
                    isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)
                )
                if not simple:
                    return False
        return True


def _plain_value(node: ast.AST | None) -> bool:
    """A constant, a name or an attribute chain of names: nothing that runs code when read
    (an f-string's formatted parts must be such values too)."""
    if node is None or isinstance(node, ast.Constant | ast.Name):
        return True
    if isinstance(node, ast.Attribute):
        return _plain_value(node.value)
    if isinstance(node, ast.JoinedStr):
        return all(
            isinstance(part, ast.Constant)
            or isinstance(part, ast.FormattedValue)
            and _plain_value(part.value)
            and part.format_spec is None
            for part in node.values
        )
    return False


def _only_reraises(node: ast.Try) -> bool:
    """Every handler is one ``raise`` (bare, or of a new exception built from plain values,
    ``from`` the caught one): library code's way to reword an error. The failure still
    surfaces — no handler can return, assign or compute — so there is no other path to take."""
    for handler in node.handlers:
        if len(handler.body) != 1 or not isinstance(handler.body[0], ast.Raise):
            return False
        raised = handler.body[0]
        exc = raised.exc
        if isinstance(exc, ast.Call):
            if exc.keywords or not _plain_value(exc.func):
                return False
            if not all(_plain_value(arg) for arg in exc.args):
                return False
        elif not _plain_value(exc):
            return False
        if not _plain_value(raised.cause):
            return False
    return True


def _annotations(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.arg | ast.AnnAssign):
        return [node.annotation] if node.annotation is not None else []
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return [node.returns] if node.returns is not None else []
    return []


def _leaves(statement: ast.stmt) -> bool:
    """Whether a ``finally`` statement returns, breaks or continues (outside nested scopes)."""
    stack: list[ast.AST] = [statement]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return | ast.Break | ast.Continue):
            return True
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.For | ast.While | ast.AsyncFor):
            # break/continue inside a loop of the finally body stay in that loop
            stack.extend(n for n in ast.walk(node) if isinstance(n, ast.Return))
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def _literal_names(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    return isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value.isidentifier()
        for e in node.elts
    )


def _frozen_dataclass_setattr(
    parent: ast.AST | None, node: ast.Attribute, index: int, parts: list[str]
) -> bool:
    """``object.__setattr__(self, "name", value)``, the idiom of frozen dataclasses: allowed
    when it sets a plain literal name on ``self``."""
    if index != len(parts) - 1 or not isinstance(parent, ast.Call) or parent.func is not node:
        return False
    args = parent.args
    return (
        len(args) == 3
        and isinstance(args[0], ast.Name)
        and args[0].id == "self"
        and isinstance(args[1], ast.Constant)
        and isinstance(args[1].value, str)
        and args[1].value.isidentifier()
        and not args[1].value.startswith("__")
    )


def _format_attributes(text: str) -> list[str]:
    """Attribute names that ``str.format`` would read for the replacement fields of ``text``
    (``{0.__class__}`` reads ``__class__``)."""
    if "{" not in text:
        return []
    names: list[str] = []
    pending = [text]
    while pending and len(names) < 64:
        try:
            fields = list(string.Formatter().parse(pending.pop()))
        except (ValueError, IndexError):
            continue
        for _, field, spec, _ in fields:
            if field:
                names += _FIELD_ATTRIBUTE.findall(_FIELD_INDEX.sub("", field))
            if spec and "{" in spec:
                pending.append(spec)
    return names


def execution_mode_notes(source: str, filename: str) -> list[str]:
    """Where the candidate passes ``interpret=`` (as JAX's own kernels do: literally, through a
    variable, in ``functools.partial``). Not a violation: the engine owns the execution mode and
    sets every pallas_call's on the traced program (``runner.traced_program``), whatever was
    passed; the note says so."""
    try:
        tree = parse_source(source, filename=filename)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and any(k.arg == "interpret" for k in node.keywords):
            found.add((node.lineno, _dotted(node.func) or "a call"))
    return [
        f"`interpret=` passed to `{name}` at {filename}:{line}: the engine sets the execution "
        "mode itself (interpret on CPU, the chip's compiler for a target)"
        for line, name in sorted(found)
    ]


def static_violations(source: str, filename: str) -> list[Violation]:
    """Violations found in the candidate's source (none for a syntax error: that is a finding
    the sandbox reports as compile_error), in line order."""
    try:
        tree = parse_source(source, filename=filename)
    except (SyntaxError, ValueError):
        return []
    except (RecursionError, MemoryError):
        return [
            Violation(
                rule="forbidden_import",
                detail=f"source nested too deeply for the gate to read at {filename}:?",
            )
        ]
    scanner = _Scanner(filename)
    scanner.scan(tree)
    return [v for _, v in sorted(scanner.violations, key=lambda item: item[0])]


class EditScan:
    """The static rules for many small edits of one source (the search's mutants), each edit
    scanned only where it differs: ``violations(edited) == static_violations(edited, ...)``.

    Every rule looks at a node, its parents within its top-level statement, and the module's
    import names; so the findings of a module are those of its top-level statements, each
    scanned alone with the module's import names. An edit that changes lines within one
    statement (or one line's statements) and keeps the line count and every import is scanned
    there, and the other statements keep the source's findings. Anything else (an import, a
    line added, a change across statements or outside them, a source that does not parse) is
    scanned whole. A module of thousands of lines costs a statement's scan per edit, not the
    module's. Screening only: the check of a proposal scans it whole."""

    def __init__(self, source: str, filename: str) -> None:
        self.filename = filename
        self.lines = source.splitlines(keepends=True)
        self.found: list[tuple[int, Violation]] = []
        self.aliases: dict[str, str] = {}
        # Top-level statements by their lines (those sharing a line merged), and whether each
        # holds an import: an edit of such a statement may change the module's import names.
        self.segments: list[tuple[int, int, bool]] = []
        try:
            tree = parse_source(source, filename=filename)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return  # no segments: every edit is scanned whole
        scanner = _Scanner(filename)
        scanner.scan(tree)
        if any(line == 0 for line, _ in scanner.violations):
            return  # a finding without a line belongs to no statement
        self.found, self.aliases = scanner.violations, scanner.aliases
        for node in tree.body:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            last = node.end_lineno or node.lineno
            imports = any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(node))
            if self.segments and first <= self.segments[-1][1]:
                start, _, had = self.segments.pop()
                first, imports = start, imports or had
            self.segments.append((first, last, imports))

    def violations(self, edited: str) -> list[Violation]:
        lines = edited.splitlines(keepends=True)
        segment = self._segment_of_change(lines)
        if segment is None:
            return static_violations(edited, self.filename)
        start, end = segment
        try:
            tree = parse_source("".join(lines[start - 1 : end]), filename=self.filename)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return static_violations(edited, self.filename)
        if any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(tree)):
            return static_violations(edited, self.filename)
        scanner = _Scanner(self.filename)
        scanner.aliases = dict(self.aliases)
        scanner.offset = start - 1
        scanner.scan(tree)
        kept = [(line, v) for line, v in self.found if not start <= line <= end]
        return [v for _, v in sorted(kept + scanner.violations, key=lambda item: item[0])]

    def _segment_of_change(self, lines: list[str]) -> tuple[int, int] | None:
        """The lines of the one import-free top-level statement ``lines`` changes, or None."""
        if len(lines) != len(self.lines) or not self.segments:
            return None
        first, last = changed_lines(self.lines, lines)
        if last < first:
            return None
        for start, end, imports in self.segments:
            if start <= first and last <= end:
                return None if imports else (start, end)
        return None


def changed_lines(original: list[str], edited: list[str]) -> tuple[int, int]:
    """The first and last lines (1-based) of ``original`` that ``edited`` changes, from the
    longest common head and tail; first > last where it only adds lines (or none)."""
    shortest = min(len(original), len(edited))
    head = next((i for i in range(shortest) if original[i] != edited[i]), shortest)
    tail = next(
        (i for i in range(shortest - head) if original[-1 - i] != edited[-1 - i]), shortest - head
    )
    return head + 1, len(original) - tail
