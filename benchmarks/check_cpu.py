"""What does one check cost in CPU, counted over every process it starts? Side by side with a
baseline revision, in one run.

A check's CPU is spent in four or five processes (the command, the spec's child, the
candidate's child, one or two executors, bubblewrap around each), so ``rusage`` misses part of
it (what bubblewrap reaps). Each measured command runs in a cgroup of its own (cgroup v1's
``cpuacct``, else cgroup v2's ``cpu.stat``: root or a delegated folder), which counts every
process it starts. Thread pools that spin make absolute CPU-seconds drift with the machine's
load, so each figure is also given in *units*: the CPU of one fresh JAX process
(``import jax``, one trivial jit, ``JAX_PLATFORMS=cpu``), measured in the same run.

Two ways a check runs:

- ``one-shot``: ``nearmiss check SPEC KERNEL`` in a new process (what a user's CI does);
- ``worker``: the second and later of ``--checks`` checks run one after another in one process,
  as a worker (``nearmiss worker``, ``repair``, ``fleet``) runs them: CPU per check past the
  first, so what a process keeps between checks (executors on a CPU) counts.

Each kernel is checked by this tree and by ``--baseline`` (a temporary git worktree, the same
virtual environment), alternated so both see the same load; medians of ``--repeat``.

    .venv/bin/python benchmarks/check_cpu.py --baseline REV [--repeat 3] [--checks 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from throwaway import CLI, ROOT, baseline_worktree

KERNELS = [
    ("softmax_rows", "golden.py"),
    ("softmax_rows", "variants/floor_grid.py"),
]
UNIT = "import jax; jax.block_until_ready(jax.jit(lambda x: x + 1)(1.0))"
# Checks one after another in one process, children kept where this tree keeps them.
WORKER = """
import sys
from nearmiss.engine.check import check
from nearmiss.engine.runner import spares
getattr(spares, "keep_warm", getattr(spares, "keep_executors", lambda: None))()
spec, kernel, checks = sys.argv[1], sys.argv[2], int(sys.argv[3])
for seed in range(checks):
    check(spec, kernel, seed=seed)
"""


class CpuGroup:
    """A cgroup that counts the CPU of every process started in it."""

    def __init__(self, scratch_name: str) -> None:
        self.folder, self.read = self._make(scratch_name)

    @staticmethod
    def _make(name: str):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if fields[2] == "cgroup" and "cpuacct" in fields[3].split(","):
                folder = Path(fields[1]) / name
                folder.mkdir()
                return folder, lambda f: int((f / "cpuacct.usage").read_text()) / 1e9
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if fields[2] == "cgroup2":
                folder = Path(fields[1]) / name
                folder.mkdir()

                def usage(f: Path) -> float:
                    stat = dict(x.split() for x in (f / "cpu.stat").read_text().splitlines())
                    return int(stat["usage_usec"]) / 1e6

                return folder, usage
        raise SystemExit("check_cpu: no cgroup hierarchy to count CPU in (cpuacct or v2)")

    def cpu_s(self, argv: list[str], cwd: Path, env: dict[str, str]) -> float:
        """CPU-seconds of the command and everything it starts."""
        # The command enters the group before it execs, so its every descendant is counted.
        enter = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        before = self.read(self.folder)
        subprocess.run(
            ["sh", "-c", enter, str(self.folder), *argv],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return self.read(self.folder) - before

    def remove(self) -> None:
        self.folder.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--checks", type=int, default=4, help="checks per worker process")
    args = parser.parse_args()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    try:
        group = CpuGroup(f"nearmiss-bench-{os.getpid()}")
    except OSError as exc:
        raise SystemExit(f"check_cpu: cannot make a cgroup ({exc.strerror}): run as root") from exc
    with (
        tempfile.TemporaryDirectory(prefix="nearmiss-bench-") as scratch,
        baseline_worktree(args.baseline, Path(scratch) / "baseline") as baseline,
    ):
        trees = {"this tree": ROOT, args.baseline: baseline}
        try:
            unit = statistics.median(
                group.cpu_s([sys.executable, "-c", UNIT], ROOT, env) for _ in range(args.repeat)
            )
            print(f"unit (one fresh JAX process): {unit:.2f} CPU-s", file=sys.stderr)
            rows = []
            for op, kernel in KERNELS:
                spec = ROOT / "pallas_ops" / op / "spec.py"
                candidate = ROOT / "pallas_ops" / op / kernel
                one_shot = {name: [] for name in trees}
                worker = {name: [] for name in trees}
                for attempt in range(args.repeat):
                    for name, tree in trees.items():
                        tree_env = {**env, "PYTHONPATH": str(tree)}
                        # A cache of its own per run: every check draws and computes afresh.
                        tree_env["NEARMISS_CACHE_DIR"] = str(Path(scratch) / f"c{attempt}{name}")
                        check = [CLI, "check", str(spec), str(candidate), "--seed", "1"]
                        one_shot[name].append(
                            group.cpu_s([sys.executable, "-c", *check], tree, tree_env)
                        )
                        first = group.cpu_s(
                            [sys.executable, "-c", WORKER, str(spec), str(candidate), "1"],
                            tree,
                            {**tree_env, "NEARMISS_CACHE_DIR": "off"},
                        )
                        many = group.cpu_s(
                            [
                                sys.executable,
                                "-c",
                                WORKER,
                                str(spec),
                                str(candidate),
                                str(args.checks),
                            ],
                            tree,
                            {**tree_env, "NEARMISS_CACHE_DIR": "off"},
                        )
                        worker[name].append((many - first) / (args.checks - 1))
                    print(f"  {op}/{kernel}: run {attempt + 1} of {args.repeat}", file=sys.stderr)
                for name in trees:
                    o, w = statistics.median(one_shot[name]), statistics.median(worker[name])
                    rows.append((f"{op}/{kernel}", name, o, w))
            print(f"\nCPU per check (unit = one fresh JAX process = {unit:.2f} CPU-s)")
            print(f"{'kernel':34} {'tree':12} {'one-shot':>16} {'in a worker':>16}")
            for label, name, o, w in rows:
                print(
                    f"{label:34} {name[:12]:12} {o:6.2f} s {o / unit:5.2f} u "
                    f"{w:6.2f} s {w / unit:5.2f} u"
                )
            for op, kernel in KERNELS:
                label = f"{op}/{kernel}"
                mine = next(r for r in rows if r[0] == label and r[1] == "this tree")
                old = next(r for r in rows if r[0] == label and r[1] != "this tree")
                print(
                    f"{label}: this tree / {args.baseline}: one-shot {mine[2] / old[2]:.2f}x, "
                    f"in a worker {mine[3] / old[3]:.2f}x"
                )
        finally:
            group.remove()


if __name__ == "__main__":
    main()
