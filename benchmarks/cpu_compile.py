"""Do the engine's CPU compile options (``runner.cpu_compile.CPU_OPTIONS``) give XLA's default
numbers on this jaxlib, bit for bit, and what do they save? Run it on a new jaxlib before
adding its release to ``cpu_compile.FLAG_KNOWN_IN``.

Two parts, in one run:

- the artifacts: every bundled op's golden and variants, exported as a check exports them
  (interpret mode) on up to three listed cases and two hidden draws, each compiled with XLA's
  defaults and with ``CPU_OPTIONS`` (which goes first alternates), outputs compared bit for bit;
  compile CPU (every thread of this process) and wall time summed for each;
- the spec's child: every bundled and shipped spec's inputs and eager reference, listed and
  hidden cases on two seeds (with the hidden cases' tolerance), computed in two processes, one
  with the options in ``XLA_FLAGS`` and one without, and compared.

    .venv/bin/python benchmarks/cpu_compile.py [--ops softmax_rows,layer_norm]

Exits 1 where any number differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_SPECS = ROOT / "tests" / "shipped"
SEEDS = (0, 1)


def digest(tree) -> str:
    import jax
    import numpy as np

    hashed = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        array = np.asarray(leaf)
        hashed.update(f"{array.dtype}{array.shape}".encode() + array.tobytes())
    return hashed.hexdigest()


def spec_digests(paths: list[Path]) -> dict[str, object]:
    """Each spec's inputs and references, listed and hidden, on ``SEEDS``, as digests."""
    import jax
    import numpy as np

    from nearmiss.engine.runner.case_draw import case_key
    from nearmiss.engine.runner.hidden_cases import serve_hidden
    from nearmiss.engine.runner.selection import select_cases
    from nearmiss.engine.spec import load_spec

    found: dict[str, object] = {}
    for path in paths:
        spec = load_spec(str(path))
        name = f"{path.parent.name}/{path.name}"
        for seed in SEEDS:
            served, _ = serve_hidden(jax, np, spec, seed)
            for item in served:
                found[f"{name}/{seed}/hidden/{item.case.name}"] = [
                    digest(item.inputs),
                    digest(item.reference),
                    list(item.tolerance),
                ]
            for suite, case in select_cases(spec, "all", None):
                inputs = spec.make_inputs(case, case_key(jax, seed, suite, case.name))
                reference = jax.block_until_ready(spec.reference(*inputs))
                found[f"{name}/{seed}/{suite}/{case.name}"] = [
                    digest(inputs),
                    digest(reference),
                ]
        print(f"  spec {name}", file=sys.stderr, flush=True)
    return found


def compare_spec_children(paths: list[Path]) -> tuple[int, int]:
    """(entries, entries that differ) between a process with the options and one without."""
    from nearmiss.engine.runner.cpu_compile import option_flags

    results = []
    with tempfile.TemporaryDirectory(prefix="nearmiss-cpu-compile-") as scratch:
        for label, flags in (("defaults", ""), ("options", option_flags())):
            out = Path(scratch) / f"{label}.json"
            env = {**os.environ, "XLA_FLAGS": flags, "PYTHONPATH": str(ROOT)}
            argv = [sys.executable, __file__, "--spec-digests", str(out), *map(str, paths)]
            if subprocess.run(argv, env=env).returncode:
                raise SystemExit(
                    f"the spec's inputs and references failed with XLA_FLAGS={flags!r}"
                )
            results.append(json.loads(out.read_text()))
    defaults, options = results
    return len(defaults), sum(1 for key, value in defaults.items() if options.get(key) != value)


def compare_artifacts(folders: list[Path]) -> tuple[int, int, dict[str, float]]:
    """(programs, programs whose outputs differ, summed CPU and wall seconds of each compile)."""
    import jax
    import numpy as np
    from jax import export

    from nearmiss.engine.runner.candidate_child import import_candidate
    from nearmiss.engine.runner.cpu_compile import CPU_OPTIONS
    from nearmiss.engine.runner.hidden_cases import serve_hidden
    from nearmiss.engine.runner.interpret import force_interpret_on_cpu
    from nearmiss.engine.spec import load_spec

    force_interpret_on_cpu()
    ways = {"defaults": {}, "options": dict(CPU_OPTIONS)}
    spent = {f"{way} {what}": 0.0 for way in ways for what in ("cpu", "wall")}
    programs = differ = 0
    for folder in folders:
        spec = load_spec(str(folder / "spec.py"))
        cases = [*spec.compact, *spec.extended][:3]
        inputs = [spec.make_inputs(c, jax.random.key(i)) for i, c in enumerate(cases)]
        inputs += [item.inputs for item in serve_hidden(jax, np, spec, 0)[0][:2]]
        for path in [folder / "golden.py", *sorted((folder / "variants").glob("*.py"))]:
            kernel = import_candidate(str(path), f"cpu_compile_{folder.name}_{path.stem}").kernel
            for args in map(list, inputs):
                try:
                    lowered = jax.jit(export.export(jax.jit(kernel))(*args).call).lower(*args)
                except Exception:  # a variant that does not trace: nothing to compile
                    continue
                outputs = {}
                order = list(ways) if programs % 2 else list(reversed(ways))
                for way in order:
                    cpu, wall = time.process_time(), time.perf_counter()
                    try:
                        compiled = lowered.compile(compiler_options=ways[way])
                    except Exception as exc:  # one way failing where the other compiles differs
                        outputs[way] = f"compile failed: {type(exc).__name__}"
                        continue
                    spent[f"{way} cpu"] += time.process_time() - cpu
                    spent[f"{way} wall"] += time.perf_counter() - wall
                    try:
                        outputs[way] = digest(jax.block_until_ready(compiled(*args)))
                    except Exception as exc:
                        outputs[way] = f"run failed: {type(exc).__name__}"
                programs += 1
                differ += outputs["defaults"] != outputs["options"]
        print(f"  artifacts {folder.name}: {programs} programs", file=sys.stderr, flush=True)
    return programs, differ, spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma-separated bundled ops (default: all)")
    parser.add_argument("--spec-digests", help=argparse.SUPPRESS)
    parser.add_argument("specs", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.spec_digests:  # the spec's-child half, in a process of its own XLA_FLAGS
        found = spec_digests([Path(p) for p in args.specs])
        Path(args.spec_digests).write_text(json.dumps(found))
        return 0
    from pallas_ops.catalog import operators

    known = {op.name: op.spec.parent for op in operators()}
    chosen = args.ops.split(",") if args.ops else None
    if chosen and (unknown := [name for name in chosen if name not in known]):
        parser.error(f"no bundled op named {', '.join(unknown)}")
    folders = [known[name] for name in chosen or known]
    specs = [f / "spec.py" for f in folders]
    specs += [] if chosen else sorted(SHIPPED_SPECS.glob("*spec*.py"))
    import jaxlib

    from nearmiss.engine.runner.cpu_compile import option_flags

    print(f"jaxlib {jaxlib.__version__}, options: {option_flags()}")
    # The spec's half first: an XLA that does not know a flag stops its process at once.
    entries, entries_differ = compare_spec_children(specs)
    programs, differ, spent = compare_artifacts(folders)
    print(f"artifacts: {programs} programs, {differ} with other outputs")
    if programs and spent["defaults cpu"] and spent["defaults wall"]:
        print(
            f"  compile CPU {spent['options cpu']:.1f} s vs {spent['defaults cpu']:.1f} s with "
            f"XLA's defaults ({spent['options cpu'] / spent['defaults cpu']:.2f}x), wall "
            f"{spent['options wall']:.1f} s vs {spent['defaults wall']:.1f} s "
            f"({spent['options wall'] / spent['defaults wall']:.2f}x)"
        )
    print(f"spec's child: {entries} inputs and references, {entries_differ} with other numbers")
    return 1 if differ or entries_differ else 0


if __name__ == "__main__":
    sys.exit(main())
