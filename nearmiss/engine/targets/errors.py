"""Short errors from the TPU toolchain: the first meaningful sentence(s) and the candidate's line.

Pallas' TPU lowering and the Mosaic compiler explain themselves at length: an index_map's jaxpr,
the MLIR operation, documentation links, "please report a bug", an MLIR location chain. A
finding needs one or two sentences and the line of the candidate to look at. Pallas names it as
``in pallas_call _body at /path/kernel.py:6`` (the kernel body); Mosaic's compile errors carry an
MLIR location (``"/path/kernel.py":17:17``, the statement it rejected) in the message JAX wraps;
where the compiler names no line, the artifact itself still records where each kernel's
``pallas_call`` was traced (``kernel_sites``).
"""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path

MAX_CHARS = 400
MAX_INPUT_CHARS = 100_000  # compiler dumps can be huge; nothing past this is a first sentence
HEAD_CHARS = 340  # sentences are kept while they fit in this; the candidate's line comes after

# Lines that carry no finding: links, bug-report requests, the MLIR operation dump.
_NOISE_LINE = re.compile(
    r"^\s*(See (https?://|details at)|Please (report|file) a bug|For more (details|information)|"
    r"=== Source Location Trace|learning/|The MLIR operation involved|%\S+ = |\"tpu\.|"
    r"at location: loc\()"
)
_STATUS_PREFIX = re.compile(
    r"^(INTERNAL|INVALID_ARGUMENT|RESOURCE_EXHAUSTED|UNIMPLEMENTED|FAILED_PRECONDITION|"
    r"UNKNOWN|ABORTED|OUT_OF_RANGE):\s*"
)
_VERIFICATION_PREFIX = re.compile(
    r"Pallas encountered an internal verification error\. Please file a bug at \S+ "
    r"Error details:\s*"
)
# Python-style `file.py:LINE` and MLIR-style `"file.py":LINE:COL`.
# A path starts after a delimiter (the lookbehind keeps the scan linear on long tokens).
_PY_LOCATION = re.compile(r"(?<![^\s\"'(),=])(?P<file>[^\s\"'(),:=]+\.py):(?P<line>\d+)")
_MLIR_LOCATION = re.compile(r"\"(?P<file>[^\"]+\.py)\":(?P<line>\d+)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


def _matches(file: str, candidate: str | os.PathLike | None) -> bool:
    """Whether a location's file is the candidate's (by path or by name: the candidate child may
    have seen the file under another directory), or, without a candidate, user code at all."""
    if candidate is None:
        parts = Path(file).parts
        return not any(p in ("site-packages", "dist-packages", "nearmiss") for p in parts)
    wanted = str(candidate)
    return file == wanted or Path(file).name == Path(wanted).name


def candidate_locations(
    text: str, candidate: str | os.PathLike | None = None
) -> list[tuple[str, int]]:
    """The candidate's ``(file, line)`` pairs named in ``text``, in order, without repeats."""
    found: list[tuple[int, str, int]] = []
    for pattern in (_MLIR_LOCATION, _PY_LOCATION):
        for match in pattern.finditer(text):
            if _matches(match["file"], candidate):
                found.append((match.start(), match["file"], int(match["line"])))
    seen, ordered = set(), []
    for _, file, line in sorted(found):
        if (file, line) not in seen:
            seen.add((file, line))
            ordered.append((file, line))
    return ordered


def exception_text(exc: BaseException) -> str:
    """An exception's message and notes, with the MLIR location JAX strips from Mosaic errors:
    JAX re-raises them as ``MosaicError`` without the ``at location: loc(...)`` line, which
    stays in the original error (its cause)."""
    text = "\n".join([str(exc), *getattr(exc, "__notes__", ())])
    seen = {id(exc)}
    inner = exc.__cause__ or exc.__context__
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        if "loc(" in str(inner):
            text += "\n" + "\n".join(
                line for line in str(inner).splitlines() if "at location: loc(" in line
            )
            break
        inner = inner.__cause__ or inner.__context__
    return text


def exception_frames(exc: BaseException) -> list[tuple[str, int]]:
    """``(file, line)`` of an exception's traceback, innermost last."""
    return [(f.filename, f.lineno or 0) for f in traceback.extract_tb(exc.__traceback__)]


def _clean(message: str) -> str:
    lines = [line for line in message.splitlines() if not _NOISE_LINE.match(line)]
    text = " ".join(line.strip() for line in lines if line.strip())
    text = _STATUS_PREFIX.sub("", text)
    text = _VERIFICATION_PREFIX.sub("", text)
    text = text.replace("Mosaic failed to compile TPU kernel:", "Mosaic:")
    # Pallas' block-shape errors: the block sizes are what matters, not their wrappers, the
    # index_map's jaxpr or the memory space's repr.
    text = re.sub(r"Blocked\(block_size=(\d+)\)", r"\1", text)
    text = re.sub(r",? and index_map \{.*?\}(?=,| in memory|\.)", "", text)
    text = re.sub(r",? in memory space <[^>]*>", "", text)
    # XLA's out-of-memory errors quote the whole HLO instruction they were allocating for.
    text = re.sub(r"\s+for %\S+ = .*?(?=\. [A-Z])", "", text)
    text = re.sub(r"\s*It should not be possible to run out of scoped vmem\b.*", "", text)
    return re.sub(r"\s+", " ", text).strip()


_SITE_LINE = re.compile(r"^pallas_call of \S+ at (?P<file>\S+\.py):(?P<line>\d+)$")


def _short(text: str, candidate: str | os.PathLike | None) -> str:
    for file, _ in candidate_locations(text, candidate):
        text = text.replace(f'"{file}"', Path(file).name).replace(file, Path(file).name)
    return text


def trim_error(
    message: str,
    candidate: str | os.PathLike | None = None,
    frames: Iterable[tuple[str, int]] = (),
    sites: Sequence[str] = (),
) -> str:
    """At most ``MAX_CHARS`` of ``message``: its first meaningful sentence(s) — with the one that
    names the candidate's line or the block shape kept even when the first is long — then where
    in the candidate (``name.py:LINE``) to look: lines the message names, ``pallas_call of BODY
    at FILE:LINE`` lines (``export_for_tpu``'s notes, ``kernel_sites``), else the innermost
    traceback ``frames`` in the candidate, else the artifact's kernel ``sites``."""
    message = message[:MAX_INPUT_CHARS]
    site_lines, lines = [], []
    for line in message.splitlines():
        match = _SITE_LINE.match(line.strip())
        if match and _matches(match["file"], candidate):
            site_lines.append(_short(line.strip(), candidate))
        elif not match:
            lines.append(line)
    text = _short(_clean("\n".join(lines)), candidate)
    first, *rest = _SENTENCE_END.split(text)
    chosen = [first]
    for sentence in rest:
        if sum(len(s) + 1 for s in chosen) + len(sentence) > HEAD_CHARS:
            break
        chosen.append(sentence)
    key = [
        s
        for s in rest
        if s not in chosen and ("block shape" in s or candidate_locations(s, candidate))
    ][:1]
    if key:  # the sentence that says which block and where outranks the rule's fine print
        room = max(100, HEAD_CHARS - len(key[0]) - 1)
        chosen = [first if len(first) <= room else first[: room - 1].rstrip() + "…", key[0]]
    head = " ".join(chosen)
    if len(head) > HEAD_CHARS:
        head = head[: HEAD_CHARS - 1].rstrip() + "…"
    named = [f"{Path(f).name}:{n}" for f, n in candidate_locations(message, candidate)]
    where = site_lines + [f"at {w}" for w in named if w not in head and w not in str(site_lines)]
    if not named and not site_lines:
        inner = [f"at {Path(f).name}:{n}" for f, n in frames if _matches(f, candidate)]
        where = inner[-1:] or list(sites[:1])
    if where:
        head = f"{head} ({'; '.join(where[:2])})"
    return head if len(head) <= MAX_CHARS else head[: MAX_CHARS - 1] + "…"


def trim_exception(exc: BaseException, candidate: str | os.PathLike | None = None) -> str:
    """``trim_error`` of an exception raised while lowering or compiling a kernel. One raised
    without a message (a bare ``assert`` in JAX) is named by its type and the frame that
    raised it: never an empty reason."""
    text = exception_text(exc)
    if not str(exc).strip():
        frames = traceback.extract_tb(exc.__traceback__)
        where = ""
        if frames:
            last = frames[-1]
            where = f" in {last.name} ({Path(last.filename).name}:{last.lineno})"
            if last.line:
                where += f": `{last.line.strip()[:120]}`"
        text = f"{type(exc).__name__} raised without a message{where}\n{text}".rstrip()
    return trim_error(text, candidate, exception_frames(exc))


_LOC_DEF = re.compile(r"^#(?P<name>loc\d*) = loc\((?P<body>.*)\)\s*$")
_LOC_REF = re.compile(r"#(loc\d*)\b")


MAX_LOCATED_SITES = 16
MAX_LOC_NODES = 1000


def kernel_sites(module_text: str, candidate: str | os.PathLike | None = None) -> list[str]:
    """Where each Mosaic kernel of an exported module was built (``"pallas_call of _body at
    kernel.py:11"``), from the ``tpu_custom_call`` ops' MLIR locations, which
    ``Exported.mlir_module()`` keeps. One entry per kernel; the artifact may be forged, so the
    location graph is walked once per node and only so far."""
    definitions = {}
    for line in module_text.splitlines():
        match = _LOC_DEF.match(line)
        if match:
            definitions[match["name"]] = match["body"]

    def chain(ref: str) -> str:  # the location's text, innermost callee first
        bodies: list[str] = []
        seen: set[str] = set()
        stack = [ref]
        while stack and len(bodies) < MAX_LOC_NODES:
            name = stack.pop()
            if name not in seen:
                seen.add(name)
                bodies.append(definitions.get(name, ""))
                stack.extend(reversed(_LOC_REF.findall(bodies[-1])))
        return "\n".join(bodies)

    sites: list[str] = []
    for line in module_text.splitlines():
        if "@tpu_custom_call" not in line:
            continue
        name = re.search(r'kernel_name = "([^"]+)"', line)
        label = f"pallas_call of {name[1] if name else 'a kernel'}"
        ref = re.search(r"loc\(#(loc\d*)\)\s*$", line)
        where = []
        if ref and len(sites) < MAX_LOCATED_SITES:
            where = candidate_locations(chain(ref[1]), candidate)
        sites.append(f"{label} at {Path(where[0][0]).name}:{where[0][1]}" if where else label)
    return sites
