"""Forgery: rewrites the engine's audit and exporter inside its own process, then lets XLA compute
the softmax with no pallas_call at all. Only the artifact, audited and run elsewhere, counts."""

import typing

import jax

_modules = typing.sys.modules


def _clean(*args, **kwargs):
    return {
        "pallas_calls": 1,
        "outside_heavy": 0,
        "outside_light": 0,
        "costliest": [],
        "unbounded": [],
        "callbacks": [],
        "aliased_inputs": [],
    }


for _name in ("nearmiss.engine.integrity.audit", "nearmiss.engine.runner.artifact"):
    _module = _modules.get(_name)
    if _module is not None:
        for _attr in ("audit_module", "audit_candidate", "total_work"):
            if hasattr(_module, _attr):
                setattr(_module, _attr, _clean)


def kernel(x):
    return jax.nn.softmax(x, axis=-1)
