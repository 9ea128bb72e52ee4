"""The bundled operators: each folder holds spec.py, golden.py and labelled variants.

``integrity/`` holds the cheat corpus of the integrity gate: kernels that get the right numbers
the wrong way, each labelled with the rule that must reject it, and honest kernels with layout
glue outside the kernel that no rule may flag (``integrity/manifest.json``).

``variants.json`` beside the spec lists each near-miss variant with its bug family (one of
``BUG_FAMILIES``), the failure class the engine must report, the first suite that exposes it
(``fails_on``: compact, or extended when the compact suite still passes), a one-line diagnosis
and, optionally, the ``target`` the label holds for (a name of ``nearmiss.engine.targets.registry``;
default ``interpret``). A variant labelled for another target is right in CPU interpret mode —
it certifies on the interpret target alone — and wrong on its target: its failure class and
``fails_on`` are what ``check(spec, variant, seed=0, targets=("interpret", target))`` reports
(``fails_on``: the first suite with a case the target rejects). The fix of each variant is its
diff back to the golden kernel, computed on demand so it can never drift from the files.
"""

from __future__ import annotations

import ast
import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from nearmiss.engine.inputs import parse_source

CORPUS_ROOT = Path(__file__).resolve().parent

# The kinds of bug generated kernels have; a variant's label names exactly one.
BUG_FAMILIES = {
    "missing_accumulator_init": "an accumulator or running statistic is never initialised",
    "low_precision_accumulation": "partial sums kept in low precision across steps, "
    "or a dot without preferred_element_type",
    "reset_on_wrong_axis": "an accumulator is reset on the wrong grid axis",
    "wrong_index_map": "a BlockSpec index_map selects the wrong block",
    "ragged_tail": "the grid floors the size, or the tail block reads past the edge unmasked",
    "unstable_formula": "a formula that overflows or cancels (no max subtraction, "
    "naive log(1+exp))",
    "wrong_reduction_axis": "a reduction over the wrong axis",
    "wrong_scale_factor": "a wrong constant or scale factor",
    "causal_mask_off_by_one": "the causal mask admits or drops the diagonal",
    "length_mask_off_by_one": "a per-row length mask admits the position at the length or drops "
    "the last valid one",
    "wrong_out_dtype": "out_shape declares the wrong dtype",
    "compile_time_error": "index_map arity, block rank, dtype of a store, Python control flow "
    "on traced values",
    "reduction_axis_order": "the reduction axis placed before the parallel axes, so output "
    "blocks are revisited",
    "wrong_normalisation_constant": "N vs N-1, per-tile instead of global statistics",
    "accumulator_overwrite": "each step overwrites the accumulator instead of adding to it",
    # Right in interpret mode, wrong on the target the label names:
    "tpu_block_shape": "a block shape the TPU cannot hold: last two dims off the (8, 128) "
    "tiling, a rank-1 block, blocks beyond the scoped VMEM",
    "tpu_memory_space": "scratch in pl.ANY (HBM) read and written with plain loads and stores",
    "unaligned_access": "loads at dynamic offsets the TPU compiler cannot prove aligned "
    "(packed bfloat16 rows)",
    "parallel_reduction": "a reduction split across grid steps that may run in parallel: an "
    "axis declared 'parallel' on TPU, any grid axis on GPU",
    "dot_precision": "a float32 dot at DEFAULT precision, right only where float32 is exact: "
    "one bfloat16 pass on a TPU's MXU, TF32 on a GPU",
}
FAILS_ON = ("compact", "extended")
DEFAULT_TARGET = "interpret"


@dataclass(frozen=True)
class Variant:
    path: Path
    bug_family: str
    failure_class: str
    fails_on: str
    diagnosis: str
    target: str = DEFAULT_TARGET  # where the label holds (nearmiss.engine.targets.registry.TARGETS)

    @property
    def targets(self) -> tuple[str, ...] | None:
        """The ``targets`` to check the variant with for its label (None: the default)."""
        return None if self.target == DEFAULT_TARGET else (DEFAULT_TARGET, self.target)


@dataclass(frozen=True)
class Operator:
    name: str
    category: str
    spec: Path
    golden: Path
    variants: tuple[Variant, ...]


def _code_lines(path: Path) -> list[str]:
    """The file's lines after its module docstring (which differs by design: it names the bug)."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    body = parse_source(text).body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        lines = [""] * first.end_lineno + lines[first.end_lineno :]
    return lines


def fix_diff(golden: Path, variant: Path) -> str:
    """The fix of a variant: the unified diff of the code that turns it back into the golden."""
    return "".join(
        difflib.unified_diff(
            _code_lines(variant),
            _code_lines(golden),
            fromfile=f"variants/{variant.name}",
            tofile="golden.py",
        )
    )


def _spec_category(spec: Path) -> str:
    """The category named in the spec file, read as text so listing never imports JAX."""
    for line in spec.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("category="):
            return stripped.split("=", 1)[1].strip().strip(",").strip("\"'")
    return "other"


@dataclass(frozen=True)
class IntegrityCase:
    """A kernel of the cheat corpus: ``rule`` must reject it, or None for an honest kernel."""

    path: Path
    op: str
    rule: str | None

    @property
    def spec(self) -> Path:
        return self.path.parents[2] / self.op / "spec.py"


def integrity_cases(root: Path = CORPUS_ROOT) -> list[IntegrityCase]:
    entries = json.loads((root / "integrity" / "manifest.json").read_text())
    return [IntegrityCase(root / "integrity" / e["file"], e["op"], e["rule"]) for e in entries]


def load_operator(folder: Path) -> Operator:
    manifest = folder / "variants.json"
    entries = json.loads(manifest.read_text()) if manifest.is_file() else []
    variants = tuple(
        Variant(
            path=folder / "variants" / e["file"],
            bug_family=e["bug_family"],
            failure_class=e["failure_class"],
            fails_on=e.get("fails_on", "compact"),
            diagnosis=e["diagnosis"],
            target=e.get("target", DEFAULT_TARGET),
        )
        for e in entries
    )
    spec = folder / "spec.py"
    return Operator(folder.name, _spec_category(spec), spec, folder / "golden.py", variants)


def operators(root: Path = CORPUS_ROOT) -> list[Operator]:
    return [
        load_operator(folder)
        for folder in sorted(root.iterdir())
        if (folder / "spec.py").is_file() and (folder / "golden.py").is_file()
    ]


def listing(root: Path = CORPUS_ROOT) -> list[dict]:
    """The corpus as ``nearmiss corpus --json`` prints it: one entry per operator."""
    return [
        {
            "name": op.name,
            "category": op.category,
            "spec": str(op.spec),
            "golden": str(op.golden),
            "variants": [
                {
                    "path": str(v.path),
                    "bug_family": v.bug_family,
                    "failure_class": v.failure_class,
                    "fails_on": v.fails_on,
                    "diagnosis": v.diagnosis,
                    "target": v.target,
                    "fix": fix_diff(op.golden, v.path),
                }
                for v in op.variants
            ],
        }
        for op in operators(root)
    ]
