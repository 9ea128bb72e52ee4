"""What a check does for each target beyond the CPU interpret run.

- ``interpret``: nothing more; the numbers come from the interpret-mode artifact, as always.
- a TPU target: the candidate child also lowers the kernel for that chip (Mosaic), and the
  executor compiles that artifact with libtpu (compile-only) and reads its grid for TPU
  semantics (a reduction axis declared ``parallel``, an output block left and re-entered).
- ``gpu`` alone on a machine whose GPU answers (``targets.run_platform``): the check runs there,
  every pallas_call compiled by the GPU's compiler (Triton, else Mosaic GPU), so the cases' own
  numbers are the target's verdict; nothing more is lowered.
- ``gpu`` elsewhere: lowered by Pallas' Triton lowering (Mosaic GPU's, for a kernel that asks
  for it) in the candidate child and read by the executor (``targets.triton``: a refusal is
  the target's), each case run as a GPU computes (TF32 dots, values nobody wrote where a block
  runs past its array), and its grid judged: the
  kernel's BlockSpecs are read from a TPU lowering, and two grid programs writing one output
  block are a race, because GPU grid programs run concurrently — unless what each program
  stores, run on the case's inputs (``runner.footprint``), shows no element stored twice. That
  lowering is its own (``GPU_GRID``): every pallas_call with its grid, BlockSpecs, scratch and
  aliases but an empty body and no GPU compiler parameters
  (``TracedProgram.function(grid_only=True)``), so a Triton-style kernel
  (``plgpu.CompilerParams``, a body Mosaic cannot lower) still has its grid read.
"""

from __future__ import annotations

from dataclasses import dataclass

from nearmiss.engine.targets.registry import DEFAULT_TARGETS, GPU, TARGETS, parse_targets

# The chip whose lowering gives the GPU target its grid when no TPU target is asked for: any
# chip's lowering has the same BlockSpecs; v5e's is the most permissive common one.
STRUCTURE_CHIP = "tpu-v5e"
# The lowering the gpu target's grid is read from: STRUCTURE_CHIP's, of the kernels' grids only.
GPU_GRID = "gpu-grid"


@dataclass(frozen=True)
class TargetPlan:
    target: str
    structure: str | None = None  # the TPU lowering its grid is read from (None: interpret)
    compile: bool = False  # compiled by the target's own compiler (libtpu)
    semantics: str | None = None  # "tpu" or "gpu": whose grid rules apply
    on_device: bool = False  # the check's cases ran on this target's device

    @property
    def verified_by(self) -> str:
        """What stands behind this target's verdict, in words for the report (and the verdict
        line: a certificate says how each target was judged)."""
        if self.on_device:
            return "compiled for the GPU and run there, numbers checked on the device"
        if self.compile:
            return (
                "compiled by libtpu (compile-only), grid checked, numbers emulated as the chip "
                "computes and fills memory"
            )
        if self.semantics == GPU:
            return (
                "lowered by Pallas' Triton or Mosaic GPU lowering (no GPU compile), grid "
                "checked, numbers emulated as a GPU computes (TF32 dots) and fills memory (no "
                "GPU run)"
            )
        return "numbers checked in CPU interpret mode"

    @property
    def emulated(self) -> bool:
        """Whether the check also runs each case as the target computes (``runner.tpu_semantics``
        with ``runner.chip_arithmetic``): TPU targets, and the gpu target without a GPU."""
        return self.compile or self.semantics == GPU


def choose_targets(
    requested: tuple[str, ...] | None, declared: list[str] | None
) -> tuple[str, ...]:
    """The CLI's targets win; else the spec's; else the interpret target."""
    if requested:
        return parse_targets(requested)
    if declared:
        return parse_targets(declared)
    return DEFAULT_TARGETS


def plan_targets(targets: tuple[str, ...], on_device: bool = False) -> list[TargetPlan]:
    """What each target adds; ``on_device``: the check runs on this machine's GPU."""
    plans = []
    for name in targets:
        if TARGETS[name].is_tpu:
            plans.append(TargetPlan(name, name, compile=True, semantics="tpu"))
        elif name == GPU and on_device:
            plans.append(TargetPlan(name, on_device=True))
        elif name == GPU:
            plans.append(TargetPlan(name, GPU_GRID, semantics="gpu"))
        else:
            plans.append(TargetPlan(name))
    return plans


def lowerings(plans: list[TargetPlan]) -> list[str]:
    """The TPU lowerings the candidate child must export for these plans, each once (a chip's
    name, or ``GPU_GRID``)."""
    return list(dict.fromkeys(p.structure for p in plans if p.structure))
