"""Static integrity rules, read from the candidate's source before any of it executes.

A kernel needs JAX, NumPy and a little of the standard library; anything that reaches the
operating system, the network, the interpreter's internals or JAX's configuration is a way to
subvert the engine, and a ``try/except`` gives the computation a second path the suite may never
exercise. Each violation names its rule, what was found and the line.
"""

from __future__ import annotations

import ast

from nearmiss.models import Violation

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
    }
)
FORBIDDEN_CALLS = frozenset(
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
        "input",
        "exit",
        "quit",
    }
)
CALLBACK_NAMES = frozenset({"pure_callback", "io_callback", "host_callback", "callback"})
INTERPRETER_ATTRIBUTES = frozenset(
    {
        "__builtins__",
        "__globals__",
        "__class__",
        "__subclasses__",
        "__code__",
        "__dict__",
        "__import__",
        "__loader__",
        "__spec__",
        "__bases__",
        "__mro__",
        "__getattribute__",
    }
)


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


class _Scanner(ast.NodeVisitor):
    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.violations: list[Violation] = []

    def flag(self, rule: str, node: ast.AST, what: str) -> None:
        where = f"{self.filename}:{getattr(node, 'lineno', '?')}"
        self.violations.append(Violation(rule=rule, detail=f"{what} at {where}"))

    def _check_module(self, node: ast.AST, module: str) -> None:
        root = module.split(".")[0]
        if root not in ALLOWED_MODULES:
            self.flag("forbidden_import", node, f"import of `{module}`")
        elif module.startswith(("jax.experimental.host_callback", "jax._src.config")):
            self.flag(
                "host_callback" if "callback" in module else "config_tamper",
                node,
                f"import of `{module}`",
            )

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.flag("forbidden_import", node, "a relative import")
            return
        module = node.module or ""
        self._check_module(node, module)
        for alias in node.names:
            if alias.name in CALLBACK_NAMES:
                self.flag("host_callback", node, f"import of `{module}.{alias.name}`")
            if alias.name == "config" and module.split(".")[0] == "jax":
                self.flag("config_tamper", node, f"import of `{module}.config`")

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        if isinstance(node.func, ast.Name) and name in FORBIDDEN_CALLS:
            self.flag("forbidden_import", node, f"call of `{name}()`")
        if last in CALLBACK_NAMES and name not in ("callback",):
            self.flag("host_callback", node, f"host callback `{name}()`")
        if any(k.arg == "interpret" for k in node.keywords):
            self.flag(
                "config_tamper",
                node,
                f"`interpret=` passed to `{name or 'a call'}`; "
                "the engine chooses the execution mode",
            )
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in INTERPRETER_ATTRIBUTES:
            self.flag("forbidden_import", node, f"interpreter internals `{node.attr}`")
        if _dotted(node).startswith("jax.config"):
            self.flag("config_tamper", node, f"`{_dotted(node)}`")
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in INTERPRETER_ATTRIBUTES:
            self.flag("forbidden_import", node, f"interpreter internals `{node.id}`")

    def visit_Try(self, node: ast.Try) -> None:
        if node.handlers:
            self.flag(
                "exception_fallback",
                node,
                "try/except around the computation: a failure "
                "must surface, not switch to another path",
            )
        self.generic_visit(node)

    visit_TryStar = visit_Try


STATIC_RULES = ("forbidden_import", "host_callback", "config_tamper", "exception_fallback")


def static_violations(source: str, filename: str) -> list[Violation]:
    """Violations found in the candidate's source (none for a syntax error: that is a finding
    the sandbox reports as compile_error)."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError:
        return []
    scanner = _Scanner(filename)
    scanner.visit(tree)
    return scanner.violations
