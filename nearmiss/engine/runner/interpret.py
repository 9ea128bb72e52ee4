"""Make every pallas_call run in interpret mode on CPU, whatever the candidate passes.

The engine chooses the execution mode, whatever ``interpret=`` a candidate passes. JAX reads the
``pallas_tpu_interpret_mode_context_manager`` flag when ``pl.pallas_call(...)`` builds the call, so
setting it globally *before* the candidate is imported also covers calls built at import time.
On JAX versions without that flag the public entry point is wrapped instead.
"""

from __future__ import annotations

import functools


def force_interpret_on_cpu() -> str:
    """Return the JAX backend; on CPU, switch every pallas_call to interpret mode."""
    import jax

    backend = jax.default_backend()
    if backend != "cpu":
        return backend
    from jax._src import config as jax_config

    flag = getattr(jax_config, "pallas_tpu_interpret_mode_context_manager", None)
    if flag is not None:
        flag.set_global(True)
    else:  # pragma: no cover - only on JAX versions that lack the flag
        _wrap_pallas_call()
    return backend


def _wrap_pallas_call() -> None:  # pragma: no cover - see above
    from jax.experimental import pallas as pl

    original = pl.pallas_call

    @functools.wraps(original)
    def pallas_call(*args, **kwargs):
        kwargs["interpret"] = True
        return original(*args, **kwargs)

    pl.pallas_call = pallas_call
