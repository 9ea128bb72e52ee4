"""The playbook on a held-out set: JAX's own Pallas kernels with one planted bug each.

Each case is a module installed with jax (its source read at test time, never copied here),
one realistic bug planted as an exact string replacement on that source (the old text must
occur exactly once, so a jax upgrade that moves it fails loudly here rather than testing
something else), a ``kernel`` entry point and a spec of ours (``tests/shipped/``). The bugs
were written before the recipes were taught to read JAX's style, as a user would meet them:
an accumulator dtype held in a variable, a mask assigned first and applied through a
``mask_value`` (or additively), eps passed as a keyword argument to a body reached through
``functools.partial``, a grid built in a local tuple and passed through a grid_spec object.

The playbook repairs a case the way the corpus test drives it: the engine's check (compact
suite), the evidence it gives, the playbook's zero-token edit, the check again, three rounds.

Measured on each planted module: the class the engine diagnoses, then what the playbook did
before its recipes read JAX's style and after (each "after" edit certified in one round):

    case                           class         before                      after
    flash_causal_diagonal          wrong_values  no recipe                   causal_diagonal
    flash_floor_q_grid             boundary      ceil_div_grid -> certified  ceil_div_grid
    matmul_bf16_acc_dtype          precision     no recipe                   f32_accumulation
    rms_norm_no_eps                nan_inf       no recipe                   rsqrt_eps
    rms_norm_padded_variance       wrong_values  no recipe                   masked_mean
    layer_norm_padded_mean         wrong_values  no recipe                   masked_mean
    layer_norm_no_eps              nan_inf       no recipe                   rsqrt_eps
    gpu_attention_causal_diagonal  wrong_values  no recipe                   causal_diagonal
    decode_length_mask             wrong_values  no recipe                   mask_bound (new)

Before: 1 of 9 certified (the grid recipe already followed a grid through a local name and a
grid_spec). After: 9 of 9. What the recipes learned: values through every assignment of a local
name (``acc_dtype``, ``scratch_shapes``), keep-masks assigned before use and applied through
``jnp.where(mask, s, mask_value)``, additively or as ``(~mask) * big_negative``, positions from
``arange`` broadcast by ``[:, None]``/``[None, :]``, eps as a body parameter and ``1 / sqrt``,
a masked sum divided by the ``arange``'s padded width, and bodies reached through a dispatcher.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_shipped_kernels import SHIPPED, SPECS, installed_source

from activities.evidence import evidence_from_report
from activities.fixers.playbook import RECIPES, PlaybookFixer
from nearmiss.engine.check import check
from nearmiss.engine.models import CheckReport
from workflows.guards import Guards
from workflows.loop import LoopState, RepairLoop
from workflows.models import FixOutcome, FixRequest

OPS = "jax.experimental.pallas.ops"
FLASH_ENTRY = (
    "def kernel(q, k, v):\n"
    "    blocks = BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)\n"
    "    scale = 1.0 / math.sqrt(q.shape[-1])\n"
    "    return flash_attention(q, k, v, causal=CAUSAL, sm_scale=scale, block_sizes=blocks)\n"
)
LAYER_NORM_ENTRY = "def kernel(x, weight, bias):\n    return layer_norm(x, weight, bias)\n"


@dataclass(frozen=True)
class HeldOut:
    module: str
    spec: str  # a spec in tests/shipped/
    entry: str
    old: str  # must occur exactly once in the installed source
    new: str


@dataclass(frozen=True)
class PlantedSet:
    """A planted set as its test file pins it: the cases, the class each first diagnosis
    gives, the cases the playbook certifies (zero tokens, within ROUNDS; every other ends
    uncertified in ``benchmarks/held_out.py``), and the words a first diagnosis must keep
    where it names the fault's place or value. ``size`` and ``min_modules``: the set's own
    shape (test_planted_sets.py)."""

    cases: dict[str, HeldOut]
    expected_class: dict[str, str]
    expected_certified: set[str]
    expected_lead: dict[str, str] = field(default_factory=dict)
    size: int = 8
    min_modules: int = 5

    def in_the_suite(self) -> list[str]:
        """The cases the suite runs, one per thing the set shows: a case per class its first
        diagnoses give (a repair where the set has one of that class, else one whose lead is
        pinned), and a case per kind of lead (its words before the first number or index).
        How many of the whole set the fixers repair, and every case's class and lead, is
        ``benchmarks/held_out.py``'s count: a capability, not a behaviour."""
        chosen: dict[tuple[str, str], str] = {}
        for name in sorted(
            self.cases,
            key=lambda n: (n not in self.expected_certified, n not in self.expected_lead, n),
        ):
            chosen.setdefault(("class", self.expected_class[name]), name)
        for name in sorted(self.expected_lead):
            chosen.setdefault(("lead", lead_kind(self.expected_lead[name])), name)
        return sorted(set(chosen.values()))


def lead_kind(lead: str) -> str:
    """What a pinned lead says, without its numbers and indices: "the kernel carries q",
    "weights too sharp", "a constant factor"."""
    return " ".join(re.split(r"[\d\[(]", lead)[0].split()[:4])


HELD_OUT = {
    # A causal mask assigned first (``causal_mask = col_ids <= row_ids``), combined with the
    # segment mask and applied additively through the ``mask_value`` keyword: drops the diagonal.
    "flash_causal_diagonal": HeldOut(
        f"{OPS}.tpu.flash_attention",
        "flash_causal",
        FLASH_ENTRY.replace("CAUSAL", "True"),
        "        causal_mask = col_ids <= row_ids\n"
        "        mask = (\n"
        "            causal_mask if mask is None else jnp.logical_and(mask, causal_mask)\n"
        "        )\n\n"
        "      s = s if mask is None",
        "        causal_mask = col_ids < row_ids\n"
        "        mask = (\n"
        "            causal_mask if mask is None else jnp.logical_and(mask, causal_mask)\n"
        "        )\n\n"
        "      s = s if mask is None",
    ),
    # The query grid axis floor-divided, in a local ``grid`` tuple passed through
    # ``pltpu.PrefetchScalarGridSpec``: a ragged query length loses its last rows.
    "flash_floor_q_grid": HeldOut(
        f"{OPS}.tpu.flash_attention",
        "flash_ragged",
        FLASH_ENTRY.replace("CAUSAL", "False"),
        "      pl.cdiv(q_seq_len, block_q),\n      kv_seq_len // block_k_major,\n",
        "      q_seq_len // block_q,\n      kv_seq_len // block_k_major,\n",
    ),
    # The accumulator dtype in a variable, read by the scratch and (through acc_ref.dtype) by
    # the dot's preferred_element_type.
    "matmul_bf16_acc_dtype": HeldOut(
        f"{OPS}.tpu.matmul",
        "tpu_matmul",
        SHIPPED["tpu_matmul"][1],
        "  acc_dtype = jnp.float32\n",
        "  acc_dtype = jnp.bfloat16\n",
    ),
    # eps a keyword-only parameter bound by functools.partial, the normaliser 1 / sqrt(var).
    "rms_norm_no_eps": HeldOut(
        f"{OPS}.gpu.rms_norm",
        "gpu_norm_zero_rows",
        SHIPPED["gpu_rms_norm"][1],
        "  rstd = 1 / jnp.sqrt(var + eps)\n",
        "  rstd = 1 / jnp.sqrt(var)\n",
    ),
    # A masked sum of squares (``mask = col_idx < n_col``) divided by the padded block width.
    "rms_norm_padded_variance": HeldOut(
        f"{OPS}.gpu.rms_norm",
        "gpu_norm_zero_rows",
        SHIPPED["gpu_rms_norm"][1],
        "  var /= n_col\n  rstd = 1 / jnp.sqrt(var + eps)\n",
        "  var /= block_size\n  rstd = 1 / jnp.sqrt(var + eps)\n",
    ),
    # The same for the mean of a layer norm.
    "layer_norm_padded_mean": HeldOut(
        f"{OPS}.gpu.layer_norm",
        "gpu_layer_norm",
        LAYER_NORM_ENTRY,
        "  mean /= n_col\n",
        "  mean /= block_size\n",
    ),
    "layer_norm_no_eps": HeldOut(
        f"{OPS}.gpu.layer_norm",
        "gpu_layer_norm",
        LAYER_NORM_ENTRY,
        "  rstd = 1 / jnp.sqrt(var + eps)\n",
        "  rstd = 1 / jnp.sqrt(var)\n",
    ),
    # Positions from jnp.arange broadcast with [:, None] / [None, :], the mask assigned and
    # applied as jnp.where(mask, qk, DEFAULT_MASK_VALUE).
    "gpu_attention_causal_diagonal": HeldOut(
        f"{OPS}.gpu.attention",
        "gpu_attention",
        "def kernel(q, k, v):\n"
        "    scale = 1.0 / math.sqrt(q.shape[-1])\n"
        "    return mha(q, k, v, None, sm_scale=scale, causal=True)\n",
        "        causal_mask = span_q[:, None] >= span_k[None, :]\n"
        "        mask = (\n"
        "            causal_mask if mask is None else jnp.logical_and(mask, causal_mask)\n"
        "        )\n"
        "      # Apply mask to qk.\n",
        "        causal_mask = span_q[:, None] > span_k[None, :]\n"
        "        mask = (\n"
        "            causal_mask if mask is None else jnp.logical_and(mask, causal_mask)\n"
        "        )\n"
        "      # Apply mask to qk.\n",
    ),
    # A length mask that lets the first padding key in, applied additively
    # (``qk += (~mask) * big_negative``).
    "decode_length_mask": HeldOut(
        f"{OPS}.gpu.decode_attention",
        "gpu_decode_attention",
        "def kernel(q, k, v):\n"
        "    lengths = jnp.full((q.shape[0],), 300, jnp.int32)\n"
        "    return mqa(q, k, v, kv_seq_len=lengths, block_k=128, k_splits=4)\n",
        "(indices < kv_seq_len)",
        "(indices <= kv_seq_len)",
    ),
}

# The cases the playbook certifies (zero tokens, within ROUNDS); every other one must end
# uncertified — add a case here when a recipe starts repairing it.
EXPECTED_REPAIRS = {
    "flash_causal_diagonal",
    "flash_floor_q_grid",
    "matmul_bf16_acc_dtype",
    "rms_norm_no_eps",
    "rms_norm_padded_variance",
    "layer_norm_padded_mean",
    "layer_norm_no_eps",
    "gpu_attention_causal_diagonal",
    "decode_length_mask",
}
ROUNDS = 3
SUITE, SEED = "compact", 3


def planted(case: HeldOut) -> str:
    source = installed_source(case.module)
    assert source.count(case.old) == 1, f"{case.module}: the planted text moved"
    return source.replace(case.old, case.new) + "\n\n" + case.entry


def test_the_held_out_set_is_large_and_varied_enough():
    assert set(RECIPE_TAKEN) == set(HELD_OUT) and set(RECIPE_TAKEN.values()) <= set(RECIPES)
    assert len(HELD_OUT) >= 8
    assert len({c.module for c in HELD_OUT.values()}) >= 5
    assert set(HELD_OUT) >= EXPECTED_REPAIRS
    assert len(EXPECTED_REPAIRS) * 2 >= len(HELD_OUT)  # at least half certify, zero tokens


def diagnose_planted(spec: Path, source: str, candidate: Path) -> CheckReport:
    """The engine's check of a planted kernel: a bug, not certified, and no cheat."""
    candidate.write_text(source)
    report = check(spec, candidate, SUITE, SEED)
    assert not report.certified and report.integrity.ok, report.diagnosis
    return report


async def repair_planted(spec: Path, source: str, candidate: Path, fixer=None):
    """Check the planted kernel, then let the playbook (or ``fixer``, another zero-token one)
    repair it for up to ROUNDS rounds: the repair loop itself (``workflows.loop.RepairLoop``,
    as a session sets it up for the fixer's kind) decides every step, its checks run here on
    the compact suite at SEED instead of in a worker. The candidate file holds the best
    source at the end. (first report, last report, steps)."""
    fixer = fixer or PlaybookFixer()
    kind = fixer.kind
    loop = RepairLoop(
        LoopState(
            guards=Guards(max_rounds=ROUNDS, no_progress_rounds=ROUNDS + 1),
            deterministic_fixer=kind.deterministic,
            certify_suite=SUITE,
            keep_unedited=kind.screens,
        )
    )
    state, texts, reports = loop.state, {}, {}
    first: CheckReport | None = None
    steps: list[str] = []

    def stored(text: str) -> str:
        key = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        texts[key] = text
        return key

    step = loop.begin(stored(source), 0.0)
    while step.action.kind != "stop":
        action = step.action
        if action.kind == "fix":
            base = action.candidate_hash
            evidence = loop.evidence_of(base)
            assert evidence is not None
            result = await fixer.propose(
                FixRequest(
                    spec_path=str(spec),
                    spec_source=spec.read_text(),
                    source=texts[base],
                    candidate_name=candidate.name,
                    evidence=evidence,
                    round=len(state.rounds) + 1,
                    tried=list(state.tried),
                    skip=state.searched.get(base, 0),
                )
            )
            assert result.tokens.total == 0 and result.model == kind.name
            if base != state.current_hash:
                steps.append("from the unedited kernel:")
            if result.source is None:
                steps.append("no recipe" if kind.name == "playbook" else result.reason)
            else:
                assert result.summary in RECIPES or result.summary.startswith("mutant:")
            outcome = FixOutcome(
                candidate_hash=stored(result.source) if result.source is not None else None,
                summary=result.summary or "",
                reason=result.reason,
                model=result.model,
                resume_at=result.resume_at,
            )
            step = loop.on_fix(outcome, 0.0)
            continue
        key = (action.candidate_hash, action.suite)
        if key not in reports:  # a certify on SUITE is the validate's check again
            candidate.write_text(texts[action.candidate_hash])
            reports[key] = check(spec, candidate, action.suite, SEED)
        report = reports[key]
        if action.kind == "forensics":
            assert not report.certified and report.integrity.ok, report.diagnosis
            first = report
            steps.append(f"diagnosed {report.failure_class}")
        step = loop.on_evidence(action, evidence_from_report(report, key[0], ""), 0.0)
        if action.kind == "validate":
            round_ = state.rounds[-1]
            steps.append(f"{round_.summary} -> {report.failure_class or 'certified'}")
            if round_.outcome == "regression_reverted":
                steps[-1] += " (reverted)"
            elif state.current_hash != action.candidate_hash and round_.outcome == "same":
                steps[-1] += " (no better than the best, which stays)"
    assert first is not None
    candidate.write_text(texts[state.best_hash])
    return first, reports[(state.best_hash, SUITE)], steps


async def assert_playbook_outcome(
    planted_set: PlantedSet, name: str, tmp_path: Path, record_property
) -> None:
    """The planted set tests' one assertion: the class the engine diagnoses first (and, where
    the set pins one, the lead its diagnosis gives), then, for a case the set expects the
    playbook to repair, that its rounds certify (zero tokens). How many of a set the fixers
    repair is a capability count: ``benchmarks/held_out.py`` runs every case's rounds."""
    case = planted_set.cases[name]
    spec = SPECS / f"{case.spec}_spec.py"
    if name in planted_set.expected_certified:
        first, report, steps = await repair_planted(spec, planted(case), tmp_path / "kernel.py")
        record_property("playbook_steps", " | ".join(steps))
        print(f"{name}: {' | '.join(steps)}")
        assert report.certified and report.integrity.ok, f"{name}: {steps}: {report.diagnosis}"
    else:
        first = diagnose_planted(spec, planted(case), tmp_path / "kernel.py")
    expected = planted_set.expected_class[name]
    assert first.failure_class == expected, f"{name}: {first.failure_class}"
    lead = planted_set.expected_lead.get(name)
    assert lead is None or lead in first.diagnosis, f"{name}: {first.diagnosis}"


# The recipe each case's repair took (measured: the docstring's table). The suite repairs one
# case per recipe; ``benchmarks/held_out.py --sets shipped`` repairs all nine.
RECIPE_TAKEN = {
    "flash_causal_diagonal": "causal_diagonal",
    "flash_floor_q_grid": "ceil_div_grid",
    "matmul_bf16_acc_dtype": "f32_accumulation",
    "rms_norm_no_eps": "rsqrt_eps",
    "rms_norm_padded_variance": "masked_mean",
    "layer_norm_padded_mean": "masked_mean",
    "layer_norm_no_eps": "rsqrt_eps",
    "gpu_attention_causal_diagonal": "causal_diagonal",
    "decode_length_mask": "mask_bound",
}
ONE_PER_RECIPE = sorted(
    {recipe: name for name, recipe in sorted(RECIPE_TAKEN.items(), reverse=True)}.values()
)


@pytest.mark.parametrize("name", ONE_PER_RECIPE)
async def test_playbook_on_a_held_out_kernel(name, tmp_path: Path, record_property):
    case = HELD_OUT[name]
    spec = SPECS / f"{case.spec}_spec.py"
    if name not in EXPECTED_REPAIRS:  # how far the playbook gets: benchmarks/held_out.py
        diagnose_planted(spec, planted(case), tmp_path / "kernel.py")
        return
    _, report, steps = await repair_planted(spec, planted(case), tmp_path / "kernel.py")
    record_property("playbook_steps", " | ".join(steps))
    print(f"{name}: {' | '.join(steps)}")
    assert report.certified and report.integrity.ok, f"{name}: {steps}: {report.diagnosis}"
