"""Array files exchanged between the sandbox children and the engine.

Arrays travel as ``.npz`` files. Extension dtypes such as bfloat16 (from ml_dtypes) are stored as
their raw bits with the dtype name beside them, so nothing is ever pickled: the engine loads files
written by untrusted candidate code with ``allow_pickle=False``.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from nearmiss.engine.inputs import AST_LOCK

_META_KEY = "__nearmiss_meta__"


def dtype_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name


def is_float(dtype) -> bool:
    """Whether arrays of ``dtype`` hold floating-point numbers, ml_dtypes' (bfloat16, float8...)
    included: numpy files those under kind "V", not "f"."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or ("float" in dtype.name and hasattr(ml_dtypes, dtype.name))


def float_eps(dtype) -> float:
    """The spacing of 1.0 in ``dtype`` (bfloat16's 2^-7 included)."""
    return float(ml_dtypes.finfo(np.dtype(dtype)).eps)


def shapes_of(arrays: list[np.ndarray]) -> list[list]:
    """Arrays as ``[shape, dtype name]`` pairs: what a tracing child is told of a case's inputs."""
    return [[list(a.shape), dtype_name(a.dtype)] for a in arrays]


def restore_dtype(name: str) -> np.dtype:
    if hasattr(ml_dtypes, name):
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def save_arrays(path: str | Path, arrays: list[np.ndarray], extra: dict | None = None) -> None:
    """Write arrays (any numeric dtype, bfloat16 included) plus a small JSON-able dict."""
    payload: dict[str, Any] = {}  # Any: mypy would let **payload fill savez's allow_pickle
    names = []
    for index, array in enumerate(arrays):
        array = np.asarray(array)
        names.append(dtype_name(array.dtype))
        if array.dtype.kind == "V" or hasattr(ml_dtypes, array.dtype.name):
            array = array.view(np.dtype(f"uint{array.dtype.itemsize * 8}"))
        payload[f"a{index}"] = array
    meta = json.dumps({"dtypes": names, "extra": extra or {}})
    payload[_META_KEY] = np.frombuffer(meta.encode(), dtype=np.uint8)
    with open(path, "wb") as handle:
        np.savez(handle, **payload)


def _checked_members(path: str | Path | BinaryIO) -> None:
    """Refuse what would make the reader allocate more than the file holds (a child's file is
    untrusted): a compressed member (save_arrays never writes one; a small deflated member can
    expand to any size), or a header whose shape claims more bytes than its member has."""
    with zipfile.ZipFile(path) as archive:
        for member in archive.infolist():
            if member.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"a compressed member in an arrays file: {member.filename}")
            with archive.open(member) as stream:
                version = np.lib.format.read_magic(stream)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
                elif version == (2, 0):
                    shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
                else:  # numpy writes 3.0 only for non-latin-1 field names: never ours
                    raise ValueError(f"an array file of format {version}: {member.filename}")
                claimed = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                if claimed > member.file_size:
                    raise ValueError(f"an array larger than its file: {member.filename}")
    if not isinstance(path, (str, Path)):
        path.seek(0)


def load_arrays(path: str | Path | BinaryIO) -> tuple[list[np.ndarray], dict]:
    """Read a file (or an open one) written by save_arrays; never unpickles, and never expands
    a compressed member. NumPy parses each array's header with ``ast.literal_eval``, so this
    holds ``AST_LOCK`` (see ``nearmiss.engine.inputs``)."""
    with AST_LOCK:
        try:
            _checked_members(path)
        except (zipfile.BadZipFile, EOFError) as exc:
            raise ValueError(f"not an arrays file ({exc})") from exc
    with AST_LOCK, np.load(path, allow_pickle=False) as data:
        meta = json.loads(bytes(data[_META_KEY]).decode())
        arrays = []
        for index, name in enumerate(meta["dtypes"]):
            raw = data[f"a{index}"]
            dtype = restore_dtype(name)
            arrays.append(raw.view(dtype) if raw.dtype != dtype else raw)
    return arrays, meta.get("extra", {})
