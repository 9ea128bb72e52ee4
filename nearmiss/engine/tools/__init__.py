"""The engine side of the fix agent's tools: experiments the model runs before it edits.

Each tool is a plain synchronous function over the sandboxed runner (untrusted code — the
candidate, a probe, the model's expressions — only ever runs in sandbox children) returning a
pydantic result with a bounded ``summary`` for the model. ``TOOL_SCHEMAS`` are the OpenAI
function-tool schemas; ``run_tool`` validates a tool call's arguments against them and runs it.
"""

from nearmiss.engine.tools.dispatch import run_tool, usage
from nearmiss.engine.tools.error_map import error_map
from nearmiss.engine.tools.lower import lower
from nearmiss.engine.tools.models import (
    ErrorMapResult,
    LowerResult,
    ProbeResult,
    RunCaseResult,
    ToolResult,
)
from nearmiss.engine.tools.probe import probe
from nearmiss.engine.tools.run_case import run_case
from nearmiss.engine.tools.schemas import TOOL_NAMES, TOOL_SCHEMAS

__all__ = [
    "TOOL_NAMES",
    "TOOL_SCHEMAS",
    "ErrorMapResult",
    "LowerResult",
    "ProbeResult",
    "RunCaseResult",
    "ToolResult",
    "error_map",
    "lower",
    "probe",
    "run_case",
    "run_tool",
    "usage",
]
