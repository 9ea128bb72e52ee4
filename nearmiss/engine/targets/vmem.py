"""How much of a TPU's scoped VMEM a kernel's blocks take, before the chip says so.

libtpu reports VMEM only when a kernel overflows it (``E1001 CompileTimeScopedVmemOom ...
Scoped allocation with size 32.00M and limit 16.00M``); a kernel at 15 of 16 MiB compiles
silently and overflows with the next larger block or one more operand. So the executor estimates
the use from the artifact's Mosaic kernels (``integrity.grid.kernel_buffers``: the kernel
function's memref types, never the candidate's word), the way Pallas' pipeline allocates it:

- each blocked operand (a BlockSpec with an index map, in VMEM) takes its block's bytes twice
  when the grid has more than one point (double buffering: the next block is copied in while
  this one is used), once otherwise; operands left in ``ANY``/HBM or SMEM take no VMEM here;
- the limit is the kernel's ``vmem_limit_bytes`` where it set one, else the chip's default,
  never more than the chip's whole VMEM.

Measured against libtpu 0.0.42's compiler on every TPU target (``tests/test_vmem.py``): the
size E1001 reports is exactly the blocks' estimate (f32 and bf16 blocks, grids of 1 and 2
points, with and without a ``vmem_limit_bytes``), and a kernel compiles at exactly the limit.
Scratch buffers (``pltpu.VMEM``) are reported on their own: the compiler does not count them in
the scoped allocation it checks (a kernel with 16 MiB of blocks and 117 MiB of scratch compiled
for v5e), so they never enter the ratio.
"""

from __future__ import annotations

import math
import re
from typing import Any

MIB = 1 << 20

# The default scoped-VMEM limit of each chip, as libtpu 0.0.42's E1001 states it (v4's own
# message: "Used 32.00M of 16.00M vmem"), and the whole VMEM, which no ``vmem_limit_bytes``
# raises ("Used 128.00M of 63.94M vmem" on v5p with a 64 MiB limit asked for; v4 ignores it).
SCOPED_VMEM_DEFAULT = {"v4": 16 * MIB, "v5e": 16 * MIB, "v5p": 16 * MIB, "v6e": 32 * MIB}
VMEM_CAPACITY = {"v4": 16 * MIB, "v5e": 128 * MIB, "v5p": 64 * MIB, "v6e": 128 * MIB}

# Blocks at this share of the limit or more compile, but leave no room: a warning.
CLOSE_TO_LIMIT = 0.8

_MEMREF = re.compile(r"memref<(?P<dims>(?:\d+x)*)(?P<dtype>[A-Za-z]\w*)(?P<rest>.*)>$", re.S)
_BITS = re.compile(r"^(?:bf|f|i|si|ui)(?P<bits>\d+)")


def memref_bytes(memref: str) -> tuple[int, str] | None:
    """(bytes, memory space) of a static memref type; None for what holds no data here (a
    semaphore, a dynamic shape, an element type this reading does not know)."""
    match = _MEMREF.match(memref.strip())
    if match is None:
        return None
    space = re.search(r"#tpu\.memory_space<(\w+)>", match["rest"])
    dtype = match["dtype"]
    bits = _BITS.match(dtype)  # f32, bf16, i8, f8E4M3FN...
    if bits is None:
        return None
    width = int(bits["bits"])
    dims = [int(d) for d in match["dims"].split("x") if d]
    return math.prod(dims) * max(width, 8) // 8, space.group(1) if space else "vmem"


def vmem_use(artifact: Any, chip: str) -> dict[str, int]:
    """The largest VMEM use of any kernel in the artifact (kernels run one after another):
    ``{vmem_blocks_bytes, vmem_scratch_bytes, vmem_limit_bytes}``; {} when the artifact
    cannot be read (the compiler's verdict stands alone)."""
    from nearmiss.engine.integrity.grid import kernel_buffers

    try:
        kernels = kernel_buffers(artifact)
    except Exception:  # Undetermined, or a malformed module (the candidate's child wrote it)
        return {}
    default = SCOPED_VMEM_DEFAULT.get(chip)
    worst: dict[str, int] = {}
    for kernel in kernels:
        pipelined = math.prod(kernel.grid) > 1
        blocks = scratch = 0
        for memref, blocked in kernel.windows:
            size = memref_bytes(memref)
            if size and size[1] == "vmem":
                blocks += size[0] * (2 if blocked and pipelined else 1)
        for memref in kernel.scratch:
            size = memref_bytes(memref)
            if size and size[1] == "vmem":
                scratch += size[0]
        limit = kernel.scoped_limit or default
        if limit is None:
            continue
        limit = min(limit, VMEM_CAPACITY.get(chip, limit))
        if not worst or blocks / limit > worst["vmem_blocks_bytes"] / worst["vmem_limit_bytes"]:
            worst = {
                "vmem_blocks_bytes": blocks,
                "vmem_scratch_bytes": scratch,
                "vmem_limit_bytes": limit,
            }
    return worst


def close_to_limit(memory: dict[str, int], target: str) -> str | None:
    """A warning when a kernel that compiled leaves less than a fifth of its scoped VMEM."""
    blocks, limit = memory.get("vmem_blocks_bytes"), memory.get("vmem_limit_bytes")
    if not blocks or not limit or blocks < CLOSE_TO_LIMIT * limit or blocks > limit:
        return None
    return (
        f"VMEM close to the limit on {target}: the blocks take {blocks / MIB:.1f} MiB of the "
        f"{limit / MIB:.1f} MiB scoped VMEM ({blocks / limit:.0%}; pipelined blocks count twice), "
        "so a larger block or one more operand overflows it (E1001); smaller blocks or "
        "pltpu.CompilerParams(vmem_limit_bytes=...) leave room"
    )
