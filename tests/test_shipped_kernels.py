"""JAX's own Pallas modules, as a user hands them over: the installed module's source plus a
`kernel` entry point is a candidate that certifies.

Nothing of JAX is copied into this repository: each candidate is assembled at test time from
the module installed with jax (so the test follows the pinned version), the entry points and
specs (`tests/shipped/`) are ours. These modules pass `interpret=` through (the engine
overrides it), decorate a helper with `jax.default_matmul_precision`, reword errors in
`try/except ... raise`, import `json`, `dataclasses` and their siblings: library code the
integrity gate must let through while it still refuses the cheat corpus.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from nearmiss.engine.check import check

SPECS = Path(__file__).parent / "shipped"

SHIPPED = {
    "flash_attention": (
        "jax.experimental.pallas.ops.tpu.flash_attention",
        "def kernel(q, k, v):\n"
        "    scale = 1.0 / math.sqrt(q.shape[-1])\n"
        "    return flash_attention(q, k, v, causal=False, sm_scale=scale)\n",
    ),
    "splash_attention": (
        "jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel",
        "def kernel(q, k, v):\n"
        "    heads, seq, _ = q.shape\n"
        "    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((seq, seq))] * heads)\n"
        "    blocks = BlockSizes(block_q=128, block_kv=128, block_kv_compute=128)\n"
        "    return make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=blocks)(\n"
        "        q, k, v\n"
        "    )\n",
    ),
    "tpu_matmul": (
        "jax.experimental.pallas.ops.tpu.matmul",
        "def kernel(x, y):\n    return matmul(x, y, block_shape=(128, 128), block_k=128)\n",
    ),
    "gpu_rms_norm": (
        "jax.experimental.pallas.ops.gpu.rms_norm",
        "def kernel(x, weight, bias):\n    return rms_norm(x, weight, bias)\n",
    ),
}


def installed_source(module: str) -> str:
    """The source of a module as installed with jax (the pinned version). A third-party
    package's module that imports its siblings relatively (``from ._utils import ...``, which
    a one-file candidate cannot) gets each such import replaced by that sibling's own source,
    once, without its ``from __future__`` line (JAX's modules import absolutely: unchanged)."""
    return _inline_siblings(module, set())


def _inline_siblings(module: str, seen: set[str]) -> str:
    seen.add(module)
    source = Path(importlib.util.find_spec(module).origin).read_text()
    lines = source.splitlines(keepends=True)
    package = module.rpartition(".")[0]
    found = [n for n in ast.parse(source).body if isinstance(n, ast.ImportFrom) and n.level == 1]
    texts = []
    for node in found:  # in order: a sibling is inlined where it is first imported
        sibling = f"{package}.{node.module}"
        text = "" if sibling in seen else _inline_siblings(sibling, seen)
        texts.append(text.replace("from __future__ import annotations\n", ""))
    for node, text in reversed(list(zip(found, texts, strict=True))):
        lines[node.lineno - 1 : node.end_lineno] = [text]
    return "".join(lines)


def shipped_candidate(tmp_path: Path, name: str) -> Path:
    module, entry = SHIPPED[name]
    candidate = tmp_path / f"{name}.py"
    candidate.write_text(installed_source(module) + "\n\n" + entry)
    return candidate


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_module_with_an_entry_point_certifies(tmp_path, name):
    report = check(SPECS / f"{name}_spec.py", shipped_candidate(tmp_path, name), "compact", 3)
    assert report.integrity.ok, [v.model_dump() for v in report.integrity.violations]
    assert report.certified, [c.model_dump() for c in report.cases]


# JAX's shipped TPU kernels compute their float32 dots at DEFAULT precision: one bfloat16 pass
# on the chip (``runner.chip_arithmetic``), measured 2.6e-3 off for flash attention and 0.18
# for the matmul at K=256. Their specs here ask for float32's tolerance, so a chip spec says the
# chip's: what a kernel team would write for these kernels on a TPU.
CHIP_TOLERANCE = {"flash_attention": "(1e-2, 1e-2)", "tpu_matmul": "(0.4, 2e-2)"}


def chip_spec(tmp_path: Path, name: str) -> Path:
    source = (SPECS / f"{name}_spec.py").read_text()
    spec = tmp_path / f"{name}_chip_spec.py"
    spec.write_text(
        re.sub(r'"float32": \([^)]*\)', f'"float32": {CHIP_TOLERANCE[name]}', source, count=1)
    )
    return spec


@pytest.mark.parametrize("name", sorted(CHIP_TOLERANCE))
def test_a_shipped_tpu_module_certifies_for_the_chip_at_the_chips_tolerance(tmp_path, name):
    candidate = shipped_candidate(tmp_path, name)
    report = check(chip_spec(tmp_path, name), candidate, "compact", 3, targets=("tpu-v5e",))
    assert report.certified and report.targets["tpu-v5e"].ok, report.targets
    # At float32's tolerance the chip's arithmetic is too coarse, and the verdict says why.
    strict = check(SPECS / f"{name}_spec.py", candidate, "compact", 3, targets=("tpu-v5e",))
    tpu = strict.targets["tpu-v5e"]
    assert all(c.passed for c in strict.cases) and not strict.certified
    assert tpu.failure_class == "precision" and "one bfloat16 pass" in tpu.error, tpu


def test_a_shipped_gpu_module_certifies_for_gpu_through_the_triton_lowering(tmp_path):
    # JAX's own Triton kernel (masked loads and stores, power-of-two blocks): the gpu target's
    # emulation on a CPU must take what Pallas' Triton lowering takes and a GPU runs right.
    candidate = shipped_candidate(tmp_path, "gpu_rms_norm")
    report = check(SPECS / "gpu_rms_norm_spec.py", candidate, "compact", 3, targets=("gpu",))
    gpu = report.targets["gpu"]
    assert report.certified and gpu.ok, (report.diagnosis, gpu)
    assert "Triton" in gpu.verified_by
