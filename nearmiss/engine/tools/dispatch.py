"""``run_tool``: one model tool call in, one ``ToolResult`` out — never an exception.

The model's arguments are checked against the same schemas it was shown (unknown tool, unknown
or missing argument, wrong type → an error result that says what is expected, so the model can
correct itself on its next turn). An unexpected failure inside a tool becomes an error result
too: a tool call is one step of a repair round and must not end the round.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nearmiss.engine.runner.session import Limits
from nearmiss.engine.tools.error_map import error_map
from nearmiss.engine.tools.lower import lower
from nearmiss.engine.tools.models import Outcome, ToolResult
from nearmiss.engine.tools.probe import probe
from nearmiss.engine.tools.run_case import run_case
from nearmiss.engine.tools.schemas import TOOL_NAMES, TOOL_SCHEMAS
from nearmiss.engine.tools.text import SUMMARY_CHARS, clip

TOOLS: dict[str, Callable[..., Outcome]] = {
    "run_case": run_case,
    "error_map": error_map,
    "probe": probe,
    "lower": lower,
}
_PARAMETERS = {s["function"]["name"]: s["function"]["parameters"] for s in TOOL_SCHEMAS}
_JSON_TYPES: dict[str, type[Any]] = {"string": str, "integer": int, "object": dict}


def _describe(schema: dict[str, Any]) -> str:
    kind = schema["type"]
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    if kind == "object":
        return f"an object of {schema['additionalProperties']['type']} values"
    if "minimum" in schema:
        return f"an {kind} >= {schema['minimum']}"
    return f"a {kind}"


def usage(tool: str) -> str:
    """'probe(probe_source*: a string, reference: ...)' — * marks the required arguments."""
    parameters = _PARAMETERS[tool]
    parts = [
        f"{name}{'*' if name in parameters['required'] else ''}: {_describe(schema)}"
        for name, schema in parameters["properties"].items()
    ]
    return f"{tool}({'; '.join(parts)})"


def _conforms(value: Any, schema: dict[str, Any]) -> tuple[bool, Any]:
    """(whether the value fits, the value as the tool takes it)."""
    kind = _JSON_TYPES[schema["type"]]
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON has one number type: 45.0 is a fine dimension
    if isinstance(value, bool) or not isinstance(value, kind):
        return False, value
    if "enum" in schema and value not in schema["enum"]:
        return False, value
    if "minimum" in schema and value < schema["minimum"]:
        return False, value
    if kind is dict:
        items = {}
        for key, item in value.items():
            fits, item = _conforms(item, schema["additionalProperties"])
            if not fits:
                return False, value
            items[str(key)] = item
        value = items
    return True, value


def validate(tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(the arguments as the tool takes them, None) or ({}, what is wrong with them)."""
    parameters = _PARAMETERS[tool]
    properties = parameters["properties"]
    given = {name: value for name, value in arguments.items() if value is not None}
    unknown = sorted(str(name) for name in given if name not in properties)
    if unknown:
        return {}, f"{tool}: unknown argument(s) {', '.join(unknown)}; usage: {usage(tool)}"
    missing = [name for name in parameters["required"] if name not in given]
    if missing:
        return {}, f"{tool}: missing required {', '.join(missing)}; usage: {usage(tool)}"
    checked = {}
    for name, value in given.items():
        fits, value = _conforms(value, properties[name])
        if not fits:
            shown = clip(json.dumps(value, default=str), 80)
            return {}, (
                f"{tool}: argument {name} must be {_describe(properties[name])}, got {shown}"
            )
        checked[name] = value
    return checked, None


def _error(tool: str, message: str) -> ToolResult:
    message = clip(message, SUMMARY_CHARS - 20)
    return ToolResult(tool=tool, ok=False, summary=f"error: {message}", data={"error": message})


def run_tool(
    name: str,
    arguments: dict[str, Any] | str | None,
    *,
    spec_path: str | Path,
    candidate_path: str | Path,
    limits: Limits | None = None,
) -> ToolResult:
    """Run the tool ``name`` with the model's ``arguments`` (a dict, or the JSON text of the
    tool call) on this session's spec and current candidate."""
    if name not in TOOLS:
        return _error(str(name)[:60], f"unknown tool {name!r}; tools: {', '.join(TOOL_NAMES)}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return _error(name, f"{name}: arguments are not valid JSON ({exc.msg})")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return _error(name, f"{name}: arguments must be a JSON object; usage: {usage(name)}")
    checked, problem = validate(name, arguments)
    if problem:
        return _error(name, problem)
    try:
        outcome = TOOLS[name](spec_path, candidate_path, limits=limits, **checked)
    except Exception as exc:  # an engine bug: reported to the model and the log, not raised
        return _error(name, f"{name} failed inside the engine: {type(exc).__name__}: {exc}")
    return ToolResult(
        tool=name,
        ok=outcome.ok,
        summary=clip(outcome.summary, SUMMARY_CHARS),
        data=outcome.model_dump(mode="json", exclude={"summary"}),
    )
