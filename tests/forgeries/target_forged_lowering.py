"""Target forgery (tpu-v5e; integrity enforce with the static gate switched off, as in
``test_forgeries.py``; the gate refuses ``typing.sys`` on sight): the candidate answers the
engine's request for a TPU lowering itself, in its own process.

It is ``pallas_ops/matmul/variants/tpu_misaligned_block.py`` (64 x 64 tiles: right in interpret
mode, refused by the TPU compiler). At import it replaces the child's ``export_for_target``
(in ``__main__``, or in the engine's module in a child forked from a zygote) with one that
never lowers for the chip: it files the CPU interpret artifact it already exported as
``artifact-<target>.bin`` and says ``{"ok": True}``.
The target's verdict must come from those bytes — a CPU artifact holds no Mosaic kernel — never
from the child's word. (While candidate code runs, ``__main__`` is the blank module of a plain
``python -c``; a thread waits for the child's own to be back, and patches it then.)
"""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_sys = typing.sys


def _child():
    """The child's module: ``__main__`` in a child started for it, the engine's module in one
    forked from a zygote (``runner.zygote``)."""
    for name in ("__main__", "nearmiss.engine.runner.candidate_child"):
        module = _sys.modules.get(name)
        if module is not None and hasattr(module, "export_for_target"):
            return module
    return None


def _forged_export_for_target(kernel, request, target):
    child = _child()
    exported = next(iter(child._EXPORTED.values()))[2]  # the one shape's CPU artifact
    folder = child.Path(request["dir"])
    (folder / f"artifact-{target}.bin").write_bytes(exported)
    return {"ok": True}


def _patch_when_back():
    while _child() is None:
        _sys.modules["time"].sleep(0.001)
    _child().export_for_target = _forged_export_for_target


_sys.modules["importlib"].import_module("threading").Thread(
    target=_patch_when_back, daemon=True
).start()

BM, BN, BK = 64, 64, 64


def _matmul_body(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def kernel(a, b):
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(BM, m), min(BN, n), min(BK, k)
    return pl.pallas_call(
        _matmul_body,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b)
