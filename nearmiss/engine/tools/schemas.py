"""The tools as the model sees them: OpenAI function-tool schemas.

The descriptions are written for the model: what the tool answers, what it costs, what it
cannot do. The same schemas validate the model's arguments in ``dispatch`` — one definition,
so what the model is told and what is enforced cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from nearmiss.engine.runner.lower_child import TARGETS
from nearmiss.engine.spec import DTYPES

_CASE = {
    "case": {
        "type": "string",
        "description": "Name of a case of the spec's compact or extended suite, e.g. 'ragged' "
        "(default: the first compact case). With dims/dtype/profile it is the base they vary.",
    },
    "dims": {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "description": "Custom case: dimension sizes to change, by the spec's dimension names, "
        'e.g. {"R": 45}; the others come from the base case. Only the spec\'s own dimension '
        "names, at most 8x the largest size its suites use.",
    },
    "dtype": {
        "type": "string",
        "enum": list(DTYPES),
        "description": "Custom case: input dtype; only dtypes the spec tests are accepted.",
    },
    "profile": {
        "type": "string",
        "description": "Custom case: value profile of the inputs ('normal' or one the spec's "
        "suites use, e.g. 'large').",
    },
    "seed": {
        "type": "integer",
        "minimum": 0,
        "description": "Input seed (default 0); the same seed gives the same inputs.",
    },
}


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


TOOL_SCHEMAS: list[dict[str, Any]] = [
    _tool(
        "run_case",
        "Run the current candidate kernel on one test case and get the evidence: pass/fail, "
        "failure class, the error with the kernel's own line, per-output error statistics, "
        "where the mismatches sit and a diagnosis. Use it to test a hypothesis on a case the "
        "suites do not have (a custom size, dtype or value profile). Takes a few seconds.",
        dict(_CASE),
        [],
    ),
    _tool(
        "error_map",
        "Show where on the output one case's errors sit: which of the kernel's output tiles "
        "(its BlockSpec blocks) are bad, with counts, the bad index ranges along each axis, and "
        "an ASCII map of tiles ('#' mostly bad, '+' some, '.' clean). Use it to tell a ragged "
        "tail, one bad tile row or a wrong index_map from errors everywhere.",
        dict(_CASE),
        [],
    ),
    _tool(
        "probe",
        "Run an instrumented copy of the kernel on one case and summarise the arrays it "
        "captures: shape, dtype, min/max/mean, NaN and Inf counts, and, for names given in "
        "`reference`, how many elements differ from a reference expression and the first "
        "differing index. Use it to see intermediates (an accumulator, a carry, a mask) the "
        "output hides. The probe is never certified and changes nothing.",
        {
            "probe_source": {
                "type": "string",
                "description": "A complete Python file defining probe(*inputs) with the kernel's "
                "inputs, returning a dict name -> array; e.g. the kernel with extra outputs of "
                "its pallas_call that store intermediates. Same rules as a kernel: import only "
                "jax, numpy and pure standard modules; no try/except, no interpret=, no "
                "callbacks. Rule-breaking probes are refused without running.",
            },
            "reference": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Optional: name -> JAX expression giving the value that probe "
                "output should have, evaluated with the inputs bound to the spec's names (see "
                "`inputs` in any case line) and jnp, jax, lax, np available, e.g. "
                '{"acc": "jnp.cumsum(x, axis=1)"}.',
            },
            **_CASE,
        },
        ["probe_source"],
    ),
    _tool(
        "lower",
        "Lower the candidate for another platform without running it (TPU: Mosaic, GPU: "
        "Triton/Mosaic GPU) and return the lowering errors with the kernel's line, or ok. "
        "Catches block shapes that break a platform's tiling rules and unsupported operations "
        "that CPU interpret mode accepts. Says 'unavailable' when this machine cannot lower "
        "for that platform.",
        {
            "platform": {
                "type": "string",
                "enum": list(TARGETS),
                "description": "Target platform (default 'tpu').",
            },
            **_CASE,
        },
        [],
    ),
]

TOOL_NAMES = tuple(schema["function"]["name"] for schema in TOOL_SCHEMAS)
