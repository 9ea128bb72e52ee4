"""``nearmiss spec check SPEC`` and ``nearmiss spec new OUT``: writing specs that hold up.

``check`` exits 0 when every case's tolerance sits between the reference's own noise and a
bfloat16 computation, 1 when one is too tight or too loose, 2 when the spec does not load or run;
with ``--tell-apart A B``, 0 when a case tells the two kernels apart, 1 when none drawn does.
``new`` exits 0 with the spec written and calibrated, 1 when it was written but does not run yet
or its measured tolerance is above what its outputs' type explains (said on stderr), 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

from nearmiss.engine.errors import UsageError
from nearmiss.engine.hidden import NO_SIZE_TO_DRAW
from nearmiss.engine.spec import CATEGORIES, DTYPES
from nearmiss.reports.text import table

if TYPE_CHECKING:
    from nearmiss.engine.authoring.calibration import CaseNoise, SpecNoise

# The calibration and the spec writer are imported when a spec command runs: every command
# builds this parser, and `nearmiss check` needs neither.

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
_SUITES = ("compact", "extended", "all")


def add_parser(commands) -> None:
    spec_cmd = commands.add_parser("spec", help="write and calibrate specs")
    actions = spec_cmd.add_subparsers(dest="spec_action", required=True)
    check = actions.add_parser(
        "check",
        help="run the reference on every case and judge each tolerance against its own noise",
        description="Exit 0 when every tolerance passes the reference's float64 noise with room "
        "and fails a bfloat16 computation; 1 when one does not; 2 when the spec does not run.",
    )
    check.add_argument("spec", type=Path)
    check.add_argument("--suite", choices=_SUITES, default="all")
    check.add_argument("--seed", type=int, help="the inputs' seed (default: a fresh one)")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.add_argument(
        "--tell-apart",
        nargs=2,
        type=Path,
        metavar=("A.py", "B.py"),
        help="find the case that tells two kernels apart (one passes, the other fails) and "
        "print it as a Case to add to the spec; exit 1 when no case drawn does",
    )
    check.add_argument(
        "--seeds",
        type=int,
        default=4,
        help="with --tell-apart: how many seeds' hidden cases to try (default 4)",
    )
    new = actions.add_parser(
        "new",
        help="write a starting spec from a reference function and its input shapes",
        description="Example: nearmiss spec new rms.py --reference ref.py:rms_norm "
        "--input x=R,C --input w=C --dims R=64,C=256 --category normalization. "
        "A quantised matmul: --input x=M,K --input w=N,K:int8 --input scale=N:float32. "
        "The tolerance written for each case dtype, and why, goes to stderr.",
    )
    new.add_argument("out", type=Path, help="the spec file to write (must not exist)")
    new.add_argument("--reference", required=True, metavar="FILE:FUNCTION")
    new.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=DIM,...[:DTYPE]",
        dest="inputs",
        help="one per positional argument of the reference, in order; DTYPE fixes that "
        f"input's dtype (one of {', '.join(DTYPES)}), else it follows --dtype",
    )
    new.add_argument("--dims", required=True, metavar="DIM=INT,...")
    new.add_argument("--name", help="the operator's name (default: the function's)")
    new.add_argument("--category", choices=CATEGORIES, default="other")
    new.add_argument(
        "--dtype",
        choices=[d for d in DTYPES if "float" in d],
        default="float32",
        help="the cases' dtype: every input without a :DTYPE of its own (default float32)",
    )
    new.add_argument(
        "--no-calibrate",
        action="store_true",
        help="write the spec without measuring its tolerance (engine defaults apply)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.spec_action == "check":
            return _check(args)
        return _new(args)
    except UsageError as exc:
        print(f"nearmiss: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _check(args: argparse.Namespace) -> int:
    if args.tell_apart:
        return _tell_apart(args)
    from nearmiss.engine.authoring import calibration

    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    result = calibration.measure(args.spec, args.suite, seed)
    print(result.model_dump_json(indent=2) if args.json else render_noise(result))
    return EXIT_PROBLEM if result.problems else EXIT_OK


def _tell_apart(args: argparse.Namespace) -> int:
    """The first case drawn that one kernel passes and the other fails, as a Case for the
    spec (``engine.tell_apart``); progress on stderr."""
    from nearmiss.engine.tell_apart import tell_apart

    if args.seeds < 1:
        raise UsageError(f"--seeds {args.seeds}: must be at least 1")
    first, second = args.tell_apart
    found = tell_apart(
        args.spec,
        first,
        second,
        seeds=args.seeds,
        progress=lambda line: print(f"nearmiss: {line}", file=sys.stderr, flush=True),
    )
    if args.json:
        print(
            json.dumps(
                None
                if found is None
                else {
                    "seed": found.seed,
                    "passes": found.passes,
                    "fails": found.fails,
                    "case": found.case.model_dump(mode="json"),
                    "add_to_spec": found.case_line(),
                },
                indent=2,
            )
        )
    elif found is None:
        print(
            f"no case drawn at seeds 1-{args.seeds} tells {first.name} and {second.name} "
            "apart: they pass and fail the same cases"
        )
    else:
        print(found.describe())
        print(f"add to the spec: {found.case_line()}")
    return EXIT_OK if found else EXIT_PROBLEM


def _new(args: argparse.Namespace) -> int:
    from nearmiss.engine.authoring import calibration
    from nearmiss.engine.authoring.spec_new import (
        NewSpec,
        choose_tolerances,
        integer_range,
        parse_dims,
        parse_input,
        render,
        with_tolerance,
    )
    from nearmiss.engine.spec import DEFAULT_TOLERANCES

    file, sep, function = args.reference.rpartition(":")
    if not sep or not file or not function:
        raise UsageError(f"--reference {args.reference!r}: expected FILE:FUNCTION")
    if args.out.exists():
        raise UsageError(f"{args.out} exists; choose another name or remove it first")
    if args.out.suffix != ".py":
        raise UsageError(f"{args.out}: a spec file must end in .py")
    new = NewSpec(
        name=args.name or function,
        category=args.category,
        reference_file=Path(file),
        function=function,
        inputs=tuple(parse_input(text) for text in args.inputs),
        dims=parse_dims(args.dims),
        dtype=args.dtype,
    )
    text = render(new)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    for name, _, dtype in new.inputs:
        drawn = integer_range(dtype) if dtype else None
        if drawn:
            whole = dtype in ("int8", "uint8")
            where = f"; set its real range (a length, an index) in INTEGER_RANGES of {args.out}"
            print(
                f"input {name} ({dtype}): integers drawn from [{drawn[0]}, {drawn[1]})"
                + (", its whole range" if whole else where),
                file=sys.stderr,
            )
    if args.no_calibrate:
        follows = any(dtype is None for _, _, dtype in new.inputs)  # gets a bf16 case
        dtypes = sorted({new.dtype} | ({"bfloat16"} if follows else set()))
        for dtype in dtypes:
            atol, rtol = DEFAULT_TOLERANCES[dtype]
            print(
                f"tolerance {dtype}: not measured (--no-calibrate): the engine default "
                f"atol={atol:g} rtol={rtol:g} applies",
                file=sys.stderr,
            )
        return EXIT_OK
    try:
        result = calibration.measure(args.out, "all", secrets.randbelow(2**31))
    except UsageError as exc:
        print(f"the spec does not run yet: {exc}\nfix it, then: nearmiss spec check {args.out}")
        return EXIT_PROBLEM
    chosen = choose_tolerances(result)
    args.out.write_text(with_tolerance(text, {c.dtype: c.value for c in chosen}))
    print(render_noise(result, heading=False))
    for c in chosen:
        written = f"atol={c.value[0]:g} rtol={c.value[1]:g}: " if c.value else ""
        print(f"tolerance {c.dtype}: {written}{c.reason}", file=sys.stderr)
    for c in chosen:
        if c.warning:
            print(c.warning, file=sys.stderr)
    # Written, but not to be trusted as it stands: say so in the exit status too.
    return EXIT_PROBLEM if any(c.warning for c in chosen) else EXIT_OK


def _percent(value: float | None) -> str:
    if value is None:
        return "-"
    if value == float("inf"):
        return "inf"
    return f"{100 * value:.3g}%"


def _explain(case: CaseNoise) -> str | None:
    where = f"{case.name} ({case.dtype}, atol={case.atol:g} rtol={case.rtol:g})"
    if case.verdict == "too_tight":
        return (
            f"too tight: {where}: the reference's own rounding (against float64) uses "
            f"{_percent(case.noise_used)} of the tolerance; a correct kernel that sums in another "
            "order fails, intermittently"
        )
    if case.verdict == "loose":
        return (
            f"too loose: {where}: the same computation in bfloat16 passes (it uses "
            f"{_percent(case.narrow_used)} of the tolerance); a kernel that accumulates in "
            "bfloat16 would be certified"
        )
    if case.verdict == "tight":
        return (
            f"tight: {where}: the reference's own noise uses {_percent(case.noise_used)} of the "
            "tolerance; another seed may fail a correct kernel"
        )
    if case.verdict == "uncalibrated":
        return f"not measured: {case.name}: {case.note}"
    return None


def _chip_lines(result: SpecNoise) -> list[str]:
    """Per dtype whose cases have float32 dots: what a TPU target's arithmetic supports (each
    dot one bfloat16 pass, as the chip computes DEFAULT precision)."""
    lines = []
    for dtype in sorted({c.dtype for c in result.cases if c.chip_used is not None}):
        mine = [c for c in result.cases if c.dtype == dtype and c.chip_used is not None]
        used = max(cast(float, c.chip_used) for c in mine)
        error = max(c.chip_max_abs or 0.0 for c in mine)
        if used <= 1:
            lines.append(
                f"TPU targets, {dtype}: float32 dots at DEFAULT precision (one bfloat16 pass on "
                f"the chip) use {_percent(used)} of the tolerance: a kernel may keep DEFAULT"
            )
        else:
            lines.append(
                f"TPU targets, {dtype}: float32 dots at DEFAULT precision (one bfloat16 pass on "
                f"the chip) use {_percent(used)} of the tolerance (max error {error:.2g}): a "
                "kernel for a TPU must ask for precision=HIGHEST, or the tolerance must be "
                f"about {2 * error:.1g}"
            )
    return lines


def render_noise(result: SpecNoise, heading: bool = True) -> str:
    lines = []
    if heading:
        lines.append(
            f"spec {result.spec}: {len(result.cases)} cases ({result.suite}), seed {result.seed}; "
            "noise = the reference against the same computation in float64, "
            "bf16 run = that computation in bfloat16"
        )
    rows = [
        [
            c.name,
            c.dtype,
            c.profile,
            f"{c.atol:g}, {c.rtol:g}",
            _percent(c.noise_used),
            _percent(c.narrow_used),
            c.verdict,
        ]
        for c in result.cases
    ]
    lines.append(
        table(
            ["case", "dtype", "profile", "atol, rtol", "noise uses", "bf16 run uses", "verdict"],
            rows,
        )
    )
    explained = [text for text in map(_explain, result.cases) if text]
    lines.extend(explained)
    for advice in result.advice:
        declared = f"declared {advice.declared[0]:g}, {advice.declared[1]:g}"
        if advice.basis == "integer":
            slack = (
                f"; the declared tolerance lets an output be off by up to {advice.integer_slack:g}"
                if advice.integer_slack >= 1
                else ""
            )
            lines.append(
                f"{advice.dtype}: every output is an integer array, compared exactly: a correct "
                f"kernel matches the reference exactly; suggested atol = rtol = 0 ({declared})"
                f"{slack}"
            )
            continue
        if advice.basis == "exact":
            lines.append(
                f"{advice.dtype}: the outputs agree exactly with the float64 computation on every "
                "case (no rounding noise): the tolerance is fine; it only needs to cover the "
                "outputs' own rounding"
            )
        span = (
            f"between {advice.at_least:g} and {advice.at_most:g}"
            if advice.at_most
            else (f"at least {advice.at_least:g}")
        )
        if advice.at_most is not None and advice.at_most < advice.at_least:
            span = (
                f"none fits: the noise needs {advice.at_least:g}, the bfloat16 run passes above "
                f"{advice.at_most:g}; make the cases' values or sizes less extreme"
            )
        lines.append(f"{advice.dtype}: suggested atol = rtol {span} ({declared})")
    kept = max((c.rounding_steps for c in result.cases), default=0)
    redone = max((c.rounding_in_loops for c in result.cases), default=0)
    if kept or redone:
        how = (
            "the float64 computation keeps the reference's own rounding, so noise is the "
            "arithmetic around it"
            if not redone
            else f"{redone} of them inside a loop or a branch, where the float64 computation "
            "rounds afresh: a case it rounds differently is not measured"
        )
        lines.append(
            f"quantised reference: it rounds floats to integers ({kept + redone} steps); {how}. "
            "A kernel must round the same values the same way: one rounded the other way on a "
            "boundary moves its outputs by a whole quantum"
        )
    lines += _chip_lines(result)
    for value, used in result.droppable:
        lines.append(
            f"warning: the reference's constant {value:g} can be left out: without it every "
            f"case stays within its tolerance (at most {_percent(used)} of it used), so a kernel "
            "that drops it certifies; add a case where it matters (for an eps: a row of zeros "
            "or a constant row)"
        )
    # A dim every case fixes and no declared domain moves: the hidden cases cannot move it either.
    fixed = {
        dim: value
        for dim, value in result.fixed_dims.items()
        if result.domains.get(dim, str(value)) == str(value)
    }
    if fixed:
        sizes = ", ".join(f"{dim}={value}" for dim, value in fixed.items())
        lines.append(
            f"warning: no case varies {', '.join(fixed)} (every case has {sizes}): a kernel "
            "right only at these sizes certifies (a hard-coded length or count, two arguments "
            "of the same shape swapped); add a case with other sizes for the dims the kernel "
            "tiles, masks or loops over, or declare the sizes it must handle "
            "(OpSpec(domains={...}): every certifying check then draws from them)"
        )
    if result.domains:
        drawn = ", ".join(f"{dim} {values}" for dim, values in result.domains.items())
        lines.append(f"hidden cases (every certifying check) draw sizes from: {drawn}")
    lines += [
        f"warning: {note}"
        for note in result.hidden_notes
        if not (fixed and note.startswith(NO_SIZE_TO_DRAW))  # said just above
    ]
    if heading:
        lines.append(f"verdict: {result.verdict}")
    return "\n".join(lines)
