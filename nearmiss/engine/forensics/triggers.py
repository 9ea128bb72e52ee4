"""Which input value triggers a failure: per-row integers (lengths, counts, offsets), or rows of
an input that are all zeros or constant, set apart the output rows that fail from those that pass.

Kernels written like JAX's take per-row integers — each sequence's length, each group's size —
and their bugs often fire only for some values: a length mask off by one spares the rows that use
the whole sequence, a floor in an index map spares lengths that are whole blocks. When an integer
input is a vector as long as an output axis, the rows that fail and the rows that pass are two
sets of its values; a threshold or a block multiple that splits them exactly names the trigger,
and otherwise the two sets themselves are the evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from nearmiss.engine.forensics.localise import index_ranges

MAX_VALUES_LISTED = 6
MAX_PER_ROW = 4096  # an integer input longer than this is data (token ids), not per-row values
TILE_SIZES = (8, 128)  # a TPU tile's sublanes and lanes: the usual block multiples


def _listed(values: np.ndarray) -> str:
    unique = np.unique(values)
    shown = ", ".join(str(int(v)) for v in unique[:MAX_VALUES_LISTED])
    return shown + (f", … ({unique.size - MAX_VALUES_LISTED} more)" if unique.size > 6 else "")


def _named(value: int, dims: Mapping[str, int]) -> str:
    names = [name for name, size in dims.items() if size == value]
    return f"{value} (= {names[0]})" if names else str(value)


def _splits(
    name: str, bad: np.ndarray, good: np.ndarray, dims: Mapping[str, int], blocks: Sequence[int]
) -> list[str]:
    """Rules on ``name``'s value that hold for every failing row and no passing one."""
    rules = []
    if bad.max() < good.min():
        rules.append(f"{name} < {_named(int(good.min()), dims)}")
    elif bad.min() > good.max():
        rules.append(f"{name} > {_named(int(good.max()), dims)}")
    for block in blocks:
        if block <= 1:
            continue
        if np.all(bad % block != 0) and np.all(good % block == 0):
            rules.append(f"{name} is not a multiple of {block}")
            break
        if np.all(bad % block == 0) and np.all(good % block != 0):
            rules.append(f"{name} is a multiple of {block}")
            break
    return rules


def geometry_blocks(geometry: Sequence[Mapping]) -> list[int]:
    """The block sizes of the kernel's outputs (``runner.geometry``), larger than one."""
    return sorted(
        {
            size
            for call in geometry
            for output in call.get("outputs", [])
            for size in output.get("block_shape", [])
            if isinstance(size, int) and size > 1
        }
    )


def _row_trigger(bad: np.ndarray, inputs: Sequence[tuple[str, np.ndarray]]) -> str | None:
    """Failing rows (along the last axis) that are exactly an input's all-zero or constant
    rows: a normaliser dividing by a zero variance or norm, an eps left out."""
    if bad.ndim < 2:
        return None
    failing = bad.any(axis=-1)
    if failing.all() or not failing.any():
        return None
    for name, values in inputs:
        if values.dtype.kind in "iub" or values.shape[:-1] != bad.shape[:-1]:
            continue
        values = values.astype(np.float64)
        for word, rows in (
            ("all zeros", np.all(values == 0, axis=-1)),
            ("constant", np.all(values == values[..., :1], axis=-1)),
        ):
            if np.array_equal(rows, failing):
                return (
                    f"The failing rows are exactly those where {name} is {word} along its last "
                    f"axis ({int(failing.sum())} of {failing.size}): a normaliser that divides "
                    "by their zero spread, or an eps left out."
                )
    return None


def value_trigger(
    bad: np.ndarray,
    inputs: Sequence[tuple[str, np.ndarray]],
    dims: Mapping[str, int],
    blocks: Sequence[int] = (),
) -> str | None:
    """One sentence naming the integer input whose values set failing rows apart, or None.

    ``bad`` is the mismatch mask of an output; ``inputs`` the case's (name, integer array)
    pairs; ``blocks`` the kernel's block sizes: with the TPU's tile sizes they are tested as
    multiples, largest first (a row of 256 is a multiple of 8 too, but 128 is the block)."""
    by_rows = _row_trigger(bad, inputs)
    if by_rows:
        return by_rows
    candidates = sorted({*blocks, *TILE_SIZES}, reverse=True)
    inputs = [(n, v) for n, v in inputs if v.dtype.kind in "iu" and v.size <= MAX_PER_ROW]
    for axis in range(bad.ndim):
        others = tuple(a for a in range(bad.ndim) if a != axis)
        rows = np.any(bad, axis=others) if others else bad
        if rows.all() or not rows.any():
            continue  # every row, or none: no contrast along this axis
        for name, values in inputs:
            if values.ndim != 1 or values.shape[0] != bad.shape[axis]:
                continue
            failing, passing = values[rows], values[~rows]
            if np.intersect1d(failing, passing).size:
                continue  # the same value both fails and passes: not what triggers it
            where = f"output axis {axis}: {index_ranges(np.nonzero(rows)[0])} fail"
            seen = f"{name} = {_listed(failing)} where it fails, {_listed(passing)} where it passes"
            rules = _splits(name, failing, passing, dims, candidates)
            if rules:
                return (
                    f"The failing rows are exactly those where {' — or equally, '.join(rules)} "
                    f"({where}; {seen})."
                )
            return f"The failing rows differ from the passing ones in {name} ({where}; {seen})."
    return None
