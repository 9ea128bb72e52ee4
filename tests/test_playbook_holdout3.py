"""The playbook on a third held-out set: eight more planted bugs it was never tuned on.

A fourth set of planted bugs, after ``test_playbook_shipped.py`` (the nine the recipes were
taught on), ``test_playbook_unseen.py`` and ``test_playbook_fresh.py`` (eight held out each).
These eight were written by someone who did not open, read or grep the recipes
(``activities/fixers/``), one bug per kind a code-generating model plausibly makes, at sites none
of the earlier sets plants, over eight modules (one each): an inverted mask, a hard-coded output
dtype, a mask one lane too wide, a forgotten term, another library's weight convention, a
flipped sign, grid axes out of step with the index maps, ``maximum`` for ``minimum``. Every bug
was kept only if the engine catches it (compact suite, seed 3, integrity ok); none of the specs
was tuned to catch one. One candidate the engine did not catch was dropped, not chased (splash's
block mask OR-ed with ``should_not_mask`` turned into an AND: the planted kernel still
certifies), and a softmax numerator in exp2 was swapped for another softmax bug when it turned
out to plant at the line ``test_playbook_unseen.py`` already uses. Same construction and drive
as the sets before: the installed source, one exact replacement that must occur once, a
``kernel`` entry point, a spec in ``tests/shipped/`` (all reused, nothing new), the helpers
imported; the engine's check, its evidence, the playbook's zero-token edit, the check again, up
to three rounds.

The bug, then the class and the start of the diagnosis (``report.diagnosis``, in short), as
measured on the planted kernel before the playbook saw any of them:

    case (module)                             the bug in words
                                              class / first line of the diagnosis, in short
    flash_causal_mask_inverted (tpu/flash_attention)  the causal mask's select inverted:
                                              ``where(mask, mask_value, 0)``, so the kept
                                              positions get the big negative and the future
                                              ones are attended
        wrong_values / values are wrong, 99.9%, all 4 tiles
    matmul_bf16_output (tpu/matmul)           the default output dtype hard-coded to bfloat16
                                              instead of the inputs' dtype
        shape_mismatch / output structure is wrong: out is bfloat16[256, 256], the
        reference's is float32[256, 256]
    softmax_mask_off_by_one (gpu/softmax)     the lane mask ``<=`` row_len, not ``<``: one
                                              lane past the end of the row is loaded and
                                              summed into the denominator
        nan_inf / 1600 NaN where the reference is finite (every element of both cases: the
        out-of-bounds lane reads as NaN in interpret mode)
    layer_norm_uncentred_output (gpu/layer_norm)  the output normalises x, not x - mean: the
                                              mean is computed, then forgotten
        wrong_values / value profile irrelevant; errors structured along axis 1, 75% (the
        all-zero rows, whose mean is 0, pass)
    rms_norm_offset_weight (gpu/rms_norm)     the weight applied as (1 + weight), the Gemma
                                              convention, on weights stored around 1
        wrong_values / the reference times a factor that differs by row (1.953 to 1.997):
        each row's own normalisation is wrong
    splash_alpha_sign (tpu/splash_attention)  the online-softmax correction with its sign
                                              flipped: exp(m_next - m_prev), not
                                              exp(m_prev - m_next)
        nan_inf / 65536 NaN where the reference is finite (every element: m_prev starts at
        the mask value, so the first correction overflows)
    gpu_attention_grid_swapped (gpu/attention)  the grid's batch and head axes swapped,
                                              (q blocks, heads, batch), while the index maps
                                              read (q block, batch, head)
        nan_inf / 16384 NaN where the reference is finite (head 1 is never written), the
        rest right
    decode_length_max (gpu/decode_attention)  each split's key bound clipped to the true
                                              length with maximum, not minimum: the cache
                                              padding past key 300 is attended
        wrong_values / values are wrong, 99.8%

All eight are diagnosed with integrity ok.

Measured figure, first run (the recipes of commit 088761c, which had not seen these bugs):
**1 of 8** certified at zero tokens — ``matmul_bf16_output`` by ``out_shape_dtype``, a recipe
older than all three planted sets. Six ended at "no recipe"; on ``splash_alpha_sign``,
``accumulator_init`` and ``ceil_div_grid`` fired without effect. Since then (tuned, so no longer
a held-out figure): 3 of 8 — ``mask_bound`` reads the ``mask=`` of a load or store
(``softmax_mask_off_by_one``), and a new ``correction_sign`` recipe flips an online softmax's
``exp(m_next - m_prev)`` (``splash_alpha_sign``). ``EXPECTED_CERTIFIED`` pins what certifies
now (a recipe that starts repairing one of the others fails its case until it is added here,
deliberately, and the docstring says what changed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_playbook_shipped import (
    FLASH_ENTRY,
    LAYER_NORM_ENTRY,
    OPS,
    HeldOut,
    PlantedSet,
    assert_playbook_outcome,
)
from test_playbook_unseen import DECODE_ENTRY, GPU_ATTENTION_ENTRY, SOFTMAX_ENTRY
from test_shipped_kernels import SHIPPED

HOLDOUT3 = {
    # The causal mask's select inverted: the allowed positions get mask_value, the masked ones
    # 0 (the six-space indent picks the multi-step kernel's line, not the single-step one's).
    "flash_causal_mask_inverted": HeldOut(
        f"{OPS}.tpu.flash_attention",
        "flash_causal",
        FLASH_ENTRY.replace("CAUSAL", "True"),
        "      s = s if mask is None else s + jnp.where(mask, 0.0, mask_value)",
        "      s = s if mask is None else s + jnp.where(mask, mask_value, 0.0)",
    ),
    # The default output dtype hard-coded to bfloat16 (a "cheaper" store) instead of x.dtype.
    "matmul_bf16_output": HeldOut(
        f"{OPS}.tpu.matmul",
        "tpu_matmul",
        SHIPPED["tpu_matmul"][1],
        "    out_dtype = x.dtype\n",
        "    out_dtype = jnp.bfloat16\n",
    ),
    # The lane mask one too wide: lane row_len (200), past the end of the row, is loaded (an
    # out-of-bounds read, NaN in interpret mode) and summed into every denominator.
    "softmax_mask_off_by_one": HeldOut(
        f"{OPS}.gpu.softmax",
        "gpu_softmax",
        SOFTMAX_ENTRY,
        "mask = jnp.arange(block_row) < row_len",
        "mask = jnp.arange(block_row) <= row_len",
    ),
    # The mean computed, then forgotten in the output: x * rstd, not (x - mean) * rstd.
    "layer_norm_uncentred_output": HeldOut(
        f"{OPS}.gpu.layer_norm",
        "gpu_layer_norm",
        LAYER_NORM_ENTRY,
        "out = (x - mean) * rstd * weight + bias",
        "out = x * rstd * weight + bias",
    ),
    # Gemma's RMSNorm convention (scale by 1 + weight) on a weight stored around 1.
    "rms_norm_offset_weight": HeldOut(
        f"{OPS}.gpu.rms_norm",
        "gpu_rms_norm",
        SHIPPED["gpu_rms_norm"][1],
        "out = x * rstd * weight + bias",
        "out = x * rstd * (1.0 + weight) + bias",
    ),
    # The online-softmax correction's exponent negated: exp(m_next - m_prev) >= 1, and inf on
    # the first block, where m_prev is still the mask value.
    "splash_alpha_sign": HeldOut(
        f"{OPS}.tpu.splash_attention.splash_attention_kernel",
        "splash_attention",
        SHIPPED["splash_attention"][1],
        "alpha = jnp.exp(m_prev - m_next)",
        "alpha = jnp.exp(m_next - m_prev)",
    ),
    # The grid's batch and head axes swapped while the index maps still read
    # (q block, batch, head): with B=1, H=2 the second head is never computed.
    "gpu_attention_grid_swapped": HeldOut(
        f"{OPS}.gpu.attention",
        "gpu_attention",
        GPU_ATTENTION_ENTRY,
        "grid_ = (pl.cdiv(q_seq_len, block_q), batch_size, num_heads)",
        "grid_ = (pl.cdiv(q_seq_len, block_q), num_heads, batch_size)",
    ),
    # Each split's key bound clipped with maximum, not minimum, against the true length: every
    # split runs to its end and the cache padding (keys 300..511) is attended.
    "decode_length_max": HeldOut(
        f"{OPS}.gpu.decode_attention",
        "gpu_decode_attention",
        DECODE_ENTRY,
        "kv_seq_len = jnp.minimum(kv_seq_len, kv_seq_len_ref[()])",
        "kv_seq_len = jnp.maximum(kv_seq_len, kv_seq_len_ref[()])",
    ),
}

# Measured on the planted kernels with check (compact suite, seed 3), before the playbook ran.
EXPECTED_CLASS = {
    "flash_causal_mask_inverted": "wrong_values",
    "matmul_bf16_output": "shape_mismatch",
    "softmax_mask_off_by_one": "boundary",  # nan_inf before the control experiments
    "layer_norm_uncentred_output": "wrong_values",
    "rms_norm_offset_weight": "wrong_values",
    "splash_alpha_sign": "nan_inf",
    "gpu_attention_grid_swapped": "nan_inf",
    "decode_length_max": "wrong_values",
}
# What the playbook certifies (zero tokens, within ROUNDS); every other case must end uncertified.
EXPECTED_CERTIFIED = {"matmul_bf16_output", "softmax_mask_off_by_one", "splash_alpha_sign"}

# Where the first diagnosis names the fault's place or value: the words it must keep. (Once a
# nudge near the key axis's end, k[0, 447, 48]; since nudges find the reference's own edge
# first, the first key past the valid length.)
EXPECTED_LEAD = {
    "decode_length_max": "position 299 is read, 300 is not. Nudging k[0, 300, 48]",
}


# The set as test_planted_sets.py checks its shape (size, spread, expectations naming its cases).
SET = PlantedSet(HOLDOUT3, EXPECTED_CLASS, EXPECTED_CERTIFIED, EXPECTED_LEAD, min_modules=5)


@pytest.mark.parametrize("name", SET.in_the_suite())
async def test_playbook_on_a_third_held_out_kernel(name, tmp_path: Path, record_property):
    await assert_playbook_outcome(SET, name, tmp_path, record_property)
