"""One sandboxed run: the spec's child prepares cases while the candidate's child runs them.

The reference child (trusted spec code) and the candidate child (untrusted) are separate
processes with separate directories, started together so JAX's start-up in one overlaps work in
the other. The engine loads every reference before the candidate runs that case. A candidate
that times out or dies loses that case only; a fresh child takes the remaining cases.
"""

from __future__ import annotations

import contextlib
import copy
import io
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
from pydantic import ValidationError

from nearmiss.engine.errors import UsageError, last_error_line
from nearmiss.engine.integrity.audit import CALLBACK_PRIMITIVES, KERNEL_LABEL, check_label
from nearmiss.engine.integrity.dynamic import ArtifactAudit, Probe
from nearmiss.engine.models import CaseSuite
from nearmiss.engine.runner import spares, truth_cache, zygote
from nearmiss.engine.runner.arrays import load_arrays
from nearmiss.engine.runner.artifact import ARTIFACT_FILE, MAX_ARTIFACT_BYTES, target_artifact_file
from nearmiss.engine.runner.candidate_child import CANDIDATE_ENV
from nearmiss.engine.runner.footprint import FOOTPRINT_FILE
from nearmiss.engine.runner.home_files import make_folder, put, read, take
from nearmiss.engine.runner.protocol import OUTPUT_FILE
from nearmiss.engine.runner.sandbox import (
    CODE_FOLDER,
    CODE_MODULES,
    ChildDied,
    ChildFailure,
    ChildTimeout,
    Limits,
    SandboxChild,
)
from nearmiss.engine.runner.scratch import remove_tree, scratch_dir
from nearmiss.engine.runner.spares import (
    CANDIDATE_MODULE,
    CANDIDATE_PREFIX,
    EXECUTOR_MODULE,
    EXECUTOR_PREFIX,
)
from nearmiss.engine.runner.spec_sandbox import (
    REFERENCE_MODULE,
    REFERENCE_PREFIX,
    read_spec,
    spec_request,
    start_spec_child,
)
from nearmiss.engine.runner.target_plan import TargetPlan, choose_targets, lowerings, plan_targets
from nearmiss.engine.runner.timing import profile_runs_for
from nearmiss.engine.targets.registry import GPU
from nearmiss.engine.targets.triton import TRITON_FILE


@dataclass(frozen=True)
class Entry:
    """What the untrusted child does with each case: its module, the function the file must
    define, and fields added to every run request (a probe's expressions, a lowering platform)."""

    module: str = CANDIDATE_MODULE
    function: str = "kernel"
    request: dict[str, Any] = field(default_factory=dict)
    # The child only exports an artifact, which the executor child runs (certifying runs).
    artifact: bool = False


KERNEL = Entry(artifact=True)


@dataclass
class CaseInfo:
    suite: CaseSuite
    name: str
    dims: dict[str, int]
    dtype: str
    profile: str
    atol: float
    rtol: float

    @property
    def key(self) -> str:
        return f"{self.suite}-{self.name}"


@dataclass
class RawCase:
    """What happened to one case, before any interpretation."""

    info: CaseInfo
    reference: list[np.ndarray]
    reference_tree: str
    inputs: list[str] = field(default_factory=list)  # "x: float32[64, 256]", from the spec's child
    # The case's inputs by name, kept for forensics (``forensics.triggers``: integer values
    # that set failing rows apart, input positions the error follows); none past a size.
    input_arrays: list[tuple[str, np.ndarray]] = field(default_factory=list)
    outputs: list[np.ndarray] | None = None
    output_extra: dict[str, Any] = field(default_factory=dict)  # what the child filed with them
    output_tree: str | None = None
    error: dict[str, Any] | None = None  # an exception inside the candidate child
    failure: str | None = None  # "timeout" or "died": the child itself failed
    failure_detail: str = ""
    log_tail: str = ""
    geometry: list[dict[str, Any]] = field(default_factory=list)
    # Float types under 32 bits the traced kernel computes in (a hint); None: not reported.
    narrow_floats: list[str] | None = None
    compile_s: float | None = None
    run_s: float | None = None
    # Asked for with ``profile_runs`` (``runner.timing``): the median of warm runs of the
    # candidate's compiled artifact and of the reference compiled by XLA, on the same device.
    kernel_warm_s: float | None = None
    reference_warm_s: float | None = None
    # Why a time asked for is missing, one field per side: the executor's thread writes the
    # kernel's, the main thread the reference's.
    kernel_profile_error: str = ""
    reference_profile_error: str = ""
    # Integrity evidence (only when the run audits): the artifact's audit — None when the
    # executor sent none or a malformed one — the reference's work, inputs changed by the call,
    # probes, and host callbacks the tracing child saw (they leave no artifact to audit).
    audited: bool = False
    audit: ArtifactAudit | None = None
    traced_callbacks: list[str] = field(default_factory=list)
    audit_error: str = ""
    reference_work: int | None = None
    inputs_changed: list[int] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    # A nudge at the reference's edge (``forensics.reach``): the element the spec's child moved
    # and the edge it found, {"index": [...], "used": i, "ignored": j}; empty for other cases.
    nudged: dict[str, Any] = field(default_factory=dict)
    # Per target (``runner.target_plan``): {"lowered": the child's lowering (ok, or its
    # refusal), "compiled": the target compiler's verdict, "grid": the grid semantics report}.
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)
    lowered: dict[str, dict[str, Any]] = field(default_factory=dict)  # per TPU chip lowered for


@dataclass
class RawRun:
    op: str
    category: str
    description: str
    platform: str
    jax_version: str
    cases: list[RawCase]
    targets: tuple[str, ...] = ()
    # The control cases the engine asked for after the suite (``forensics.controls``), by name;
    # one the spec could not serve has ``failure == "unrunnable"``. Never part of a verdict.
    controls: dict[str, RawCase] = field(default_factory=dict)
    # What the hidden cases could not cover (``nearmiss.engine.hidden``), and each dim's domain.
    notes: list[str] = field(default_factory=list)
    domains: dict[str, str] = field(default_factory=dict)


# Asked after the suite's cases, with them and the controls run so far: the control cases to
# run next, each {"name", "dims", "dtype", "profile"}, and for a nudge of a suite case
# (``forensics.reach``) "nudge": {"of": [suite, name], "input", "index", "by"} or {"of", "swap":
# [i, j]} (none: no more rounds).
ControlPlanner = Callable[[list[RawCase], dict[str, RawCase]], list[dict[str, Any]]]
# The controls, then a split of the ones that isolated several dims at once; the nudges
# (forensics.reach: up to six) go one per round, each only while those before found nothing.
CONTROL_ROUNDS = 6


class _ReferenceFeed:
    """Reads the reference child's messages on a thread, so both children progress at once.

    With a ``request`` the thread sends it first. ``restart`` (the child was a spare,
    ``runner.spares``): should the child die before its first answer, the request goes again to
    the child ``restart`` starts — a spare's death is the worker's loss, never the spec's
    finding. ``child`` is the one answering, once the first message is in.
    """

    def __init__(
        self,
        child: SandboxChild | None,
        request: dict[str, Any] | None = None,
        restart: Callable[[], SandboxChild] | None = None,
        kept: list[dict[str, Any]] | None = None,
    ) -> None:
        """``kept``: a kept answer (``truth_cache``) to hand out instead of asking ``child``,
        which may then be None (no child has been started) or a spare left waiting."""
        self.child = child
        self.request = request
        self.restart = restart
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.answer: list[dict[str, Any]] = []  # every message, to keep a full answer
        self.kept = kept is not None
        self.thread = threading.Thread(target=self._pump, daemon=True)
        if kept is not None:
            for message in kept:
                self.messages.put(message)
            self.thread = threading.Thread(target=lambda: None)  # done: nothing to read
        self.thread.start()

    def _receive(self) -> dict[str, Any]:
        assert self.child is not None  # a feed without a child hands out a kept answer
        timeout_s = self.child.limits.reference_timeout_s
        request, self.request = self.request, None
        if request is None:
            return self.child.receive(timeout_s)
        try:
            self.child.send(**request)
            return self.child.receive(timeout_s)
        except ChildDied:
            if self.restart is None:
                raise
        self.child.kill()
        self.child.close()
        try:
            self.child = self.restart()
        except (UsageError, OSError) as exc:
            raise ChildDied(f"could not be started again: {exc}") from exc
        self.child.send(**request)
        return self.child.receive(timeout_s)

    def _pump(self) -> None:
        while True:
            try:
                message = self._receive()
            except ChildFailure as exc:
                line = last_error_line(exc.log_tail)
                tail = f" — {line}" if line else ""
                message = {
                    "event": "spec_error",
                    "message": f"the spec's child failed: {exc}{tail}",
                }
            self.answer.append(copy.deepcopy(message))  # as sent: the engine edits messages
            self.messages.put(message)
            if message["event"] in ("done", "spec_error"):
                return

    def answered_all(self) -> bool:
        """Whether the child has said everything it was asked, the last word ``done``: it now
        waits for the next request."""
        self.thread.join(timeout=0)
        return (
            not self.thread.is_alive() and bool(self.answer) and self.answer[-1]["event"] == "done"
        )

    def next(self, expected: str) -> dict[str, Any]:
        message = self.messages.get()
        if message["event"] == "spec_error":
            raise UsageError(message["message"])
        if message["event"] != expected:
            raise UsageError(f"unexpected message from the spec's child: {message['event']}")
        return message


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int_list(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(type(v) is int for v in value)


def _checked_geometry(value: Any) -> list[dict[str, Any]]:
    """The child's kernel geometry if well-formed, else none: it is a hint from untrusted code."""
    try:
        ok = isinstance(value, list) and all(
            _int_list(call["grid"])
            and all(
                _int_list(o["array_shape"]) and _int_list(o["block_shape"]) for o in call["outputs"]
            )
            for call in value
        )
    except (KeyError, TypeError):
        ok = False
    return value if ok else []


def _record_integrity(raw: RawCase, message: dict[str, Any], child: _Child) -> None:
    """The integrity evidence of a successful case, each part checked before it is believed."""
    try:
        raw.audit = ArtifactAudit.model_validate(message.get("audit"))
    except ValidationError as exc:
        raw.audit = None  # judged as "could not be verified", never as clean
        error = message.get("audit_error")
        raw.audit_error = error[:200] if isinstance(error, str) and error else str(exc)[:200]
    changed = message.get("inputs_changed")
    if not _int_list(changed):
        raise ValueError("inputs_changed is not a list of indices")
    raw.inputs_changed = sorted(set(changed))
    done = message.get("probes_done")
    if not _int_list(done):
        raise ValueError("probes_done is not a list of indices")
    for probe in raw.probes:
        if probe.input in done:
            probe.outputs, _ = child.load(raw, f"probe-{probe.input}/{OUTPUT_FILE}")


# Forensics keeps a case's inputs only up to this many elements in all (a few MB).
MAX_KEPT_INPUT_ELEMENTS = 1 << 22


def _kept_inputs(path: Path) -> list[tuple[str, np.ndarray]]:
    """A case's inputs with the reference's parameter names, or none when they are large."""
    arrays, extra = load_arrays(path)
    if sum(a.size for a in arrays) > MAX_KEPT_INPUT_ELEMENTS:
        return []
    names = extra.get("names") or [f"x{i}" for i in range(len(arrays))]
    return [(str(name), array) for name, array in zip(names, arrays, strict=False)]


class _Child:
    """One restartable sandbox child: started ahead, replaced after a timeout or a crash."""

    def __init__(self, module: str, prefix: str, limits: Limits, platform: str) -> None:
        self.module = module
        self.prefix = prefix
        self.limits = limits
        self.platform = platform
        self.child: SandboxChild | None = None
        self.shows_code_at: Path | None = None  # where a candidate's child shows its file

    def start(self) -> None:
        """Start the child in a fresh home holding copies of ``files()`` (in its code folder,
        for a child that imports them)."""
        home = scratch_dir(self.prefix)
        folder = home / CODE_FOLDER if self.module in CODE_MODULES else home
        folder.mkdir(exist_ok=True)
        for path in self.files():
            shutil.copy(path, folder / path.name)
        env = self.environment(home)
        self.child = SandboxChild(
            self.module,
            home,
            self.limits,
            self.platform,
            extra_env=env,
            shows_code_at=self.shows_code_at,
        )

    def files(self) -> tuple[Path, ...]:
        return ()

    def environment(self, home: Path) -> dict[str, str]:
        """Variables the child needs beyond the sandbox's own, given its home."""
        return {}

    # A case's files live in cases/<key>/ of the child's home, which the child can write: the
    # engine reaches them through ``home_files`` only, which follows no link planted there.
    def case_dir(self, raw: RawCase) -> Path:
        assert self.child is not None
        return make_folder(self.child.home, f"cases/{raw.info.key}")

    def put(self, source: Path, raw: RawCase, name: str) -> Path:
        """Copy ``source`` into the case's folder in the child's home."""
        assert self.child is not None
        return put(source, self.child.home, f"cases/{raw.info.key}/{name}")

    def load(self, raw: RawCase, name: str) -> tuple[list[np.ndarray], dict]:
        """The arrays the child filed as ``name`` in the case's folder."""
        assert self.child is not None
        relative = f"cases/{raw.info.key}/{name}"
        return load_arrays(io.BytesIO(read(self.child.home, relative, MAX_ARTIFACT_BYTES)))

    def take(self, raw: RawCase, name: str, destination: Path) -> None:
        """Move the artifact ``name`` the child filed in the case's folder to ``destination``."""
        assert self.child is not None
        take(self.child.home, f"cases/{raw.info.key}/{name}", destination, MAX_ARTIFACT_BYTES)

    def _copy_probes(self, raw: RawCase, probe_dirs: dict[int, Path]) -> list[dict[str, Any]]:
        probes = []
        for index, source in probe_dirs.items():
            path = self.put(source / "inputs.npz", raw, f"probe-{index}/inputs.npz")
            probes.append({"input": index, "dir": str(path.parent)})
        return probes

    def ask(self, raw: RawCase, **request: Any) -> dict[str, Any] | None:
        """The child's answer for one case, or None with the child's failure put on ``raw``."""
        assert self.child is not None
        try:
            self.child.send(cmd="run", suite=raw.info.suite, name=raw.info.name, **request)
            message = self.child.receive(self.limits.case_timeout_s)
        except ChildFailure as exc:
            raw.failure = "timeout" if isinstance(exc, ChildTimeout) else "died"
            raw.failure_detail = str(exc)
            raw.log_tail = exc.log_tail
            self.stop()
            return None
        if message["event"] != "case_done" or message.get("name") != raw.info.name:
            self.unusable(raw, ValueError(f"unexpected message {message['event']!r}"))
            return None
        return message

    def unusable(self, raw: RawCase, exc: Exception) -> None:
        """The child is untrusted: a forged message or a corrupt file ends it and the case."""
        raw.outputs = raw.error = None
        raw.failure, raw.failure_detail = "died", f"unusable result from the child: {exc!r}"
        self.stop()

    def stop(self) -> None:
        if self.child is not None:
            self.child.close()
            remove_tree(self.child.home)
            self.child = None


def _record_outputs(raw: RawCase, message: dict[str, Any], child: _Child) -> None:
    """Outputs (or the error) of a run, as the executor — or a tool's child — filed them."""
    if message.get("ok"):
        raw.outputs, raw.output_extra = child.load(raw, OUTPUT_FILE)
        raw.output_tree = str(message["treedef"])
        if raw.audited:
            _record_integrity(raw, message, child)
    else:
        error = message["error"]
        if error.get("phase") not in ("trace", "compile", "run"):
            raise ValueError("error record without a valid phase")
        raw.error = error


class _Executor(_Child):
    """Runs candidates' artifacts: engine code only, the candidate never imported.

    It works on its own thread, a stage of a pipeline: it runs a case as soon as its artifact
    and inputs exist, while the candidate child exports the next and the spec's child computes
    references; the input-independence probes follow once their references are drawn.
    """

    def __init__(
        self, limits: Limits, platform: str, label: str = KERNEL_LABEL, keeps: bool = True
    ) -> None:
        super().__init__(EXECUTOR_MODULE, EXECUTOR_PREFIX, limits, platform)
        self.label = label  # the check's kernel label (``audit.check_label``)
        # Whether it may be kept for the next check (``release``): the runs' executor, never
        # the target judge, which gives candidates' chip artifacts to native compilers.
        self.keeps = keeps
        self.started_under: tuple = ()  # ``spares.key`` when it was started or taken
        self.from_spares = False
        self.ready = False
        self.work: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def submit(self, job: Callable[[], None]) -> None:
        if self.thread is None:
            if self.child is None:
                # Started on the check's thread, not the stage's: bubblewrap's
                # --die-with-parent kills a child when the *thread* that started it ends, and
                # the stage's ends with the check, which would kill an executor kept for the
                # next check (``release``). Only while no stage thread runs: once one does, a
                # child it stopped is restarted there (``_started``), by one thread only.
                self.start()
            self.thread = threading.Thread(target=self._serve, daemon=True)
            self.thread.start()
        self.work.put(job)

    def finish(self) -> None:
        """Wait until every submitted job has run; re-raise what the thread could not handle."""
        if self.thread is not None:
            self.work.put(None)
            self.thread.join()
            self.thread = None
        if self.error is not None:
            raise self.error

    def start(self) -> None:
        """A spare executor where the worker keeps them (``runner.spares``), else a new one."""
        self.started_under = spares.key(EXECUTOR_MODULE, self.limits, self.platform)
        self.child = spares.take(EXECUTOR_MODULE, self.limits, self.platform)
        self.from_spares = self.child is not None
        if self.child is None:
            super().start()

    def _serve(self) -> None:
        while (job := self.work.get()) is not None:
            try:
                job()
            except BaseException as exc:  # surfaced by finish(), in the caller's thread
                self.error = exc
                return

    def _started(self) -> str:
        """'' once the child is up, else why it could not start."""
        if self.child is None:
            self.start()
        if self.ready:
            return ""
        problem = self._await_ready()
        if problem and self.from_spares:  # lost while it waited: the worker's loss, no finding
            self.from_spares = False
            super().start()
            problem = self._await_ready()
        return problem

    def _await_ready(self) -> str:
        assert self.child is not None
        try:
            message = self.child.receive(self.limits.import_timeout_s)  # engine code only
        except ChildFailure as exc:
            self.stop()
            return f"the executor did not start: {exc}"
        if message["event"] != "ready":
            self.stop()
            return f"the executor did not start: it said {message['event']!r}"
        assert self.child.process is not None
        if self.child.process.poll() is not None:  # a spare's "ready", said before it died
            self.stop()
            return "the executor did not start: it died while it waited"
        self.ready = True
        return ""

    def _stage(self, raw: RawCase, artifact: Path, inputs: Path) -> Path:
        """The case's directory in this child's home, holding its artifact and inputs (already
        there when this child ran the case, before its probes)."""
        case_dir = self.case_dir(raw)
        if not (case_dir / ARTIFACT_FILE).is_file():  # an executor's home: engine code only
            self.put(artifact, raw, ARTIFACT_FILE)
            self.put(inputs, raw, "inputs.npz")
        return case_dir

    def run(self, raw: RawCase, artifact: Path, inputs: Path, profile_runs: int = 0) -> None:
        problem = self._started()
        if problem:
            raw.failure, raw.failure_detail = "died", problem
            return
        case_dir = self._stage(raw, artifact, inputs)
        message = self.ask(
            raw,
            dir=str(case_dir),
            audit=raw.audited,
            probes=[],
            profile_runs=profile_runs,
            label=self.label,
        )
        if message is None:
            return
        if message.get("native") is not False:  # native code ran here: not kept (``release``)
            self.keeps = False
        try:
            compile_s = _seconds(message.get("compile_s"))
            if compile_s is not None:
                raw.compile_s = (raw.compile_s or 0.0) + compile_s
            raw.run_s = _seconds(message.get("run_s"))
            raw.kernel_warm_s = _seconds(message.get("kernel_warm_s"))
            if profile_runs and raw.kernel_warm_s is None:
                why = message.get("profile_error") or "no kernel time"
                raw.kernel_profile_error = str(why)[:200]
            _record_outputs(raw, message, self)
        except Exception as exc:
            self.unusable(raw, exc)

    def probe(self, raw: RawCase, artifact: Path, inputs: Path, probe_dirs: dict[int, Path]):
        """The artifact on the probe inputs. A probe left unanswered (the child failed, or
        answered nonsense) is judged by the engine as the kernel giving no output."""
        if raw.outputs is None or self._started():
            return
        assert self.child is not None
        self._stage(raw, artifact, inputs)
        probes = self._copy_probes(raw, probe_dirs)
        try:
            self.child.send(
                cmd="probe",
                suite=raw.info.suite,
                name=raw.info.name,
                probes=probes,
                label=self.label,
            )
            message = self.child.receive(self.limits.case_timeout_s)
            done = message.get("probes_done")
            if message["event"] != "probes_done" or not _int_list(done):
                raise ValueError(f"unexpected message {message['event']!r}")
            for probe in raw.probes:
                if probe.input in done:
                    probe.outputs, _ = self.load(raw, f"probe-{probe.input}/{OUTPUT_FILE}")
        except (ChildFailure, ValueError, OSError, KeyError):
            self.stop()

    def judge(
        self, raw: RawCase, plan: TargetPlan, artifact: Path, candidate: str, inputs: Path
    ) -> None:
        """A case's lowering for ``plan.structure``: compiled for the target where it has a
        compiler here, and its grid read for the target's semantics (for a GPU, with what each
        program stores on the case's ``inputs``, where the candidate child took it)."""
        verdict = raw.targets[plan.target]
        if self._started():
            verdict["error"] = "the executor did not start"
            return
        assert self.child is not None
        assert plan.structure is not None  # judged only for a structure the kernel was lowered for
        case_dir = self.put(artifact, raw, target_artifact_file(plan.structure)).parent
        modules = triton_modules_file(artifact)
        if plan.semantics == GPU and modules.is_file():
            self.put(modules, raw, TRITON_FILE)
        if plan.semantics == GPU and footprint_file(artifact).is_file():
            self.put(footprint_file(artifact), raw, FOOTPRINT_FILE)
            self.put(inputs, raw, "inputs.npz")
        try:
            self.child.send(
                cmd="target",
                suite=raw.info.suite,
                name=raw.info.name,
                dir=str(case_dir),
                target=plan.target,
                structure=plan.structure,
                compile=plan.compile,
                semantics=plan.semantics,
                candidate=candidate,
            )
            message = self.child.receive(self.limits.case_timeout_s)
            if message["event"] != "target_done" or message.get("name") != raw.info.name:
                raise ValueError(f"unexpected message {message['event']!r}")
            verdict["compiled"], verdict["grid"] = message.get("compiled"), message.get("grid")
            if plan.semantics == GPU:
                verdict["triton"] = message.get("triton")
        except (ChildFailure, ValueError, KeyError) as exc:
            verdict["error"] = f"the target's check did not finish: {exc}"[:300]
            self.stop()

    def stop(self) -> None:
        super().stop()
        self.ready = False

    def release(self) -> None:
        """The check is over: an executor that answered everything it was asked goes back to
        ``spares`` for the next check where that is safe (``spares.give_back``), else it ends."""
        finished = self.thread is None or not self.thread.is_alive()
        child = self.child
        healthy = self.keeps and self.ready and self.error is None and finished
        if (
            child is not None
            and healthy
            and spares.give_back(child, self.started_under, self.platform)
        ):
            self.child, self.ready = None, False
            return
        self.stop()


def user_folder(shown: Path) -> Path | None:
    """The folder a candidate's user keeps it in, where its child should show it (a plain import
    there gives that ``__file__``); None for the engine's own folders (a checkout of the
    knowledge base's, a search's scratch): a candidate must not learn it is in one."""
    folder = shown.parent
    scratch = Path(tempfile.gettempdir())
    if folder.is_relative_to(scratch) and any(p.startswith("nearmiss-") for p in folder.parts):
        return None
    return folder


def _held_to_limits(cases: list[RawCase], children: tuple[_Child, ...]) -> None:
    """A limit the kernel enforced on a child after its last answer (a process the candidate
    started that grew while the engine waited on another child) fails the run's cases too."""
    for holder in children:
        group = holder.child.group if holder.child is not None else None
        breaches = group.breaches() if group is not None else []
        if not breaches:
            continue
        for raw in cases:
            if raw.failure is None:
                raw.failure = "died"
                child = holder.module.rsplit(".", 1)[-1]
                raw.failure_detail = f"{'; '.join(breaches)} (in {child}, after its answers)"
                raw.outputs = None


class _CandidateRunner(_Child):
    """Keeps one candidate child alive across cases; replaces it after a timeout or crash.

    For the kernel entry the child only traces and exports; the executor runs the artifact.
    Other entries (the fix agent's probes and lowerings) run in the child itself: they never
    certify.
    """

    def __init__(
        self,
        candidate: Path,
        limits: Limits,
        platform: str,
        entry: Entry,
        shown: Path,
        label: str = KERNEL_LABEL,
    ) -> None:
        super().__init__(entry.module, CANDIDATE_PREFIX, limits, platform)
        self.label = label  # the check's kernel label (``audit.check_label``)
        self.shows_code_at = user_folder(shown)
        self.candidate = candidate
        self.shown = shown  # the user's path, for messages
        self.entry = entry
        # Set when the candidate cannot even be imported: every case gets the same finding.
        self.import_problem: dict[str, Any] | None = None
        self.from_spare = False  # the child was a spare (``runner.spares``)

    def files(self) -> tuple[Path, ...]:
        return (self.candidate,)

    def environment(self, home: Path) -> dict[str, str]:
        # Named as the child finds it in its working directory, its code folder.
        return {CANDIDATE_ENV: self.candidate.name}

    def start(self) -> None:
        """A spare candidate child where the worker keeps them (``runner.spares``), given this
        candidate in its home and told to import it; else a new child that imports it as it
        starts."""
        # A spare shows its file where it was started to (``sandbox.CODE_MOUNT``): it serves
        # a candidate with no folder of its user's, a checkout of the knowledge base's.
        spare: SandboxChild | None = None
        if self.shows_code_at is None:
            spare = spares.take(self.entry.module, self.limits, self.platform)
        if spare is None and self.entry.module == CANDIDATE_MODULE:
            spare = zygote.fork(self.limits, self.platform, self.shows_code_at)
        self.from_spare = spare is not None
        if spare is None:
            super().start()
            return
        self.child = spare
        shutil.copy(self.candidate, (spare.code_dir or spare.home) / self.candidate.name)
        # Gone since it was taken? Then wait_ready sees it dead and starts a new child.
        with contextlib.suppress(ChildFailure):
            spare.send(cmd="load", candidate=self.candidate.name)

    def wait_ready(self) -> None:
        assert self.child is not None
        try:
            message = self.child.receive(self.limits.import_timeout_s)
        except ChildFailure as exc:
            if isinstance(exc, ChildDied) and self.from_spare:
                # A spare that died is the worker's loss, never the candidate's finding: the
                # import is tried again in a child started for it.
                self.stop()
                self.from_spare = False
                super().start()
                self.wait_ready()
                return
            self.import_problem = {
                "failure": "timeout" if isinstance(exc, ChildTimeout) else "died",
                "failure_detail": f"while importing the candidate: {exc}",
                "log_tail": exc.log_tail,
            }
            self.stop()
            return
        if message["event"] == "no_kernel":
            self.stop()
            raise UsageError(f"candidate {self.shown} defines no callable `{self.entry.function}`")
        if message["event"] == "import_failed" and isinstance(message.get("error"), dict):
            self.import_problem = {"error": {**message["error"], "phase": "import"}}
            self.stop()
        elif message["event"] != "ready":
            self.import_problem = {
                "failure": "died",
                "log_tail": self.child.log_tail(),
                "failure_detail": f"unexpected message {message['event']!r}",
            }
            self.stop()

    def _available(self, raw: RawCase) -> bool:
        """Start the child if needed; False (the import's finding put on ``raw``) if it cannot
        even import the candidate."""
        if self.import_problem is None and self.child is None:
            self.start()
            self.wait_ready()
        if self.import_problem is not None:
            for name, value in self.import_problem.items():
                setattr(raw, name, value)
            return False
        return True

    def _answer(self, raw: RawCase, **request: Any) -> dict[str, Any] | None:
        if not self._available(raw):
            return None
        case_dir = self.case_dir(raw)
        message = self.ask(raw, dir=str(case_dir), **request, **self.entry.request)
        if message is None:
            return None
        try:
            raw.geometry = _checked_geometry(message.get("geometry"))
            narrow = message.get("narrow_floats")
            ok = isinstance(narrow, list) and all(isinstance(n, str) for n in narrow)
            raw.narrow_floats = narrow if ok else None
            raw.compile_s = _seconds(message.get("compile_s"))
            raw.run_s = _seconds(message.get("run_s"))
        except Exception as exc:
            self.unusable(raw, exc)
            return None
        return message

    def export(
        self, raw: RawCase, avals: list[list[Any]], keep: Path, lower_for: list[str]
    ) -> tuple[Path | None, dict[str, Path]]:
        """The case's artifact, exported by the child from the inputs' shapes alone and moved
        at once to ``keep`` (out of the child's reach, and safe from its restarts); None with
        the finding on ``raw`` when there is none. With it, the kernel lowered for each TPU
        chip of ``lower_for`` ({chip: artifact}), moved beside it; a refused lowering is
        recorded on ``raw.lowered``."""
        answer = self._answer(raw, avals=avals, lower_for=lower_for, label=self.label)
        if answer is None:
            return None, {}
        try:
            if not self._artifact(raw, answer):
                return None, {}
            self.take(raw, ARTIFACT_FILE, keep)
            lowered = self._lowered(raw, answer, lower_for, keep)
            return keep, lowered
        except Exception as exc:
            self.unusable(raw, exc)
            return None, {}

    def _lowered(
        self, raw: RawCase, message: dict[str, Any], lower_for: list[str], keep: Path
    ) -> dict[str, Path]:
        said = message.get("lowered") or {}
        if not isinstance(said, dict):
            raise ValueError("lowerings record is not a mapping")
        moved = {}
        for chip in lower_for:
            answer = said.get(chip)
            if not isinstance(answer, dict):
                raise ValueError(f"no answer for the lowering for {chip}")
            if not answer.get("ok"):
                raw.lowered[chip] = {"ok": False, "error": str(answer.get("error", ""))[:500]}
                continue
            moved[chip] = keep.with_name(f"{keep.stem}-{chip}.bin")
            self.take(raw, target_artifact_file(chip), moved[chip])
            raw.lowered[chip] = {"ok": True, "error": None}
            triton = answer.get("triton")
            if isinstance(triton, dict):  # the gpu target's: Triton's or Mosaic GPU's lowering
                said_ok = triton.get("ok")
                raw.lowered[chip]["triton"] = {
                    "ok": said_ok if said_ok in (True, False, None) else None,
                    "error": str(triton.get("error") or "")[:500] or None,
                }
                if said_ok is True:
                    self.take(raw, TRITON_FILE, triton_modules_file(moved[chip]))
            footprint = answer.get("footprint")
            if isinstance(footprint, dict):  # the gpu target's: what each program stores
                raw.lowered[chip]["footprint"] = {
                    "ok": footprint.get("ok") is True,
                    "why": str(footprint.get("why") or "")[:300] or None,
                }
                if footprint.get("ok") is True:
                    self.take(raw, FOOTPRINT_FILE, footprint_file(moved[chip]))
        return moved

    def run(self, raw: RawCase, inputs: Path, probe_dirs: dict[int, Path]) -> None:
        """A tool's run: the child itself runs the case on its inputs (it never certifies)."""
        if not self._available(raw):
            return
        self.put(inputs, raw, "inputs.npz")
        probes = self._copy_probes(raw, probe_dirs)
        answer = self._answer(raw, audit=raw.audited, probes=probes)
        if answer is None:
            return
        try:
            _record_outputs(raw, answer, self)
        except Exception as exc:
            self.unusable(raw, exc)

    def under_tpu_semantics(
        self, raw: RawCase, inputs: Path, target: str, seed: int, **run: str
    ) -> dict:
        """The case run by the child under TPU interpret mode (``runner.tpu_semantics``; ``run``:
        its ``fill`` and ``numerics``), after every export: {"outputs", "tree", "races",
        "reduced", "undefined"}, or {"error": ...}. Only ever evidence against the candidate;
        the engine compares the outputs itself."""
        if self.child is None or self.import_problem is not None:
            return {"error": {"message": "the candidate's child is not running"}}
        try:
            case_dir = self.put(inputs, raw, "inputs.npz").parent
        except OSError as exc:  # a link of the candidate's in the way: evidence against it
            return {"error": {"message": f"the candidate's home refused its inputs: {exc}"}}
        request = {"target": target, "seed": seed, **run}
        try:
            self.child.send(
                cmd="run",
                suite=raw.info.suite,
                name=raw.info.name,
                dir=str(case_dir),
                tpu_semantics=request,
            )
            message = self.child.receive(self.limits.case_timeout_s)
            if message.get("name") != raw.info.name:
                raise ValueError("an answer for another case")
            if not message.get("ok"):
                error = message.get("error")
                return {"error": error if isinstance(error, dict) else {"message": str(error)}}
            outputs, _ = self.load(raw, OUTPUT_FILE)
            return {
                "outputs": outputs,
                "tree": str(message.get("treedef")),
                "races": message.get("races") is True,
                # Lines and words for the diagnosis; a candidate can only add to them.
                "reduced": _records(
                    message.get("reduced"), ("line", "precision", "passes", "in_kernel")
                ),
                "undefined": _records(message.get("undefined"), ("line", "what")),
            }
        except ChildFailure as exc:
            self.stop()
            kind = "timed out" if isinstance(exc, ChildTimeout) else "died"
            return {"error": {"message": f"the run under TPU semantics {kind}: {exc}"}}
        except (ValueError, OSError, KeyError) as exc:
            self.stop()
            return {"error": {"message": f"unusable answer from the child: {exc!r}"}}

    @staticmethod
    def _artifact(raw: RawCase, message: dict[str, Any]) -> bool:
        """Whether the child exported an artifact; if not, the trace/compile error is put on
        ``raw``. (The engine takes the file out of the child's home itself: ``home_files``.)"""
        callbacks = message.get("callbacks", [])
        if isinstance(callbacks, list):  # a hint that can only count against the candidate
            raw.traced_callbacks = sorted({c for c in callbacks if c in CALLBACK_PRIMITIVES})
        if not message.get("ok"):
            error = message["error"]
            if error.get("phase") not in ("trace", "compile"):
                raise ValueError("error record without a valid phase")
            raw.error = error
            return False
        return True


def triton_modules_file(artifact: Path) -> Path:
    """Where the engine keeps the Triton modules lowered beside a case's gpu-grid artifact."""
    return artifact.with_suffix(".triton.mlir")


def footprint_file(artifact: Path) -> Path:
    """Where the engine keeps the footprint program exported beside a case's gpu-grid artifact."""
    return artifact.with_suffix(".footprint.bin")


def _records(value: Any, keys: tuple[str, ...], most: int = 8) -> list[dict[str, str]]:
    """A child's list of records, each cut to ``keys`` as short strings."""
    if not isinstance(value, list):
        return []
    return [
        {key: str(item.get(key, ""))[:200] for key in keys}
        for item in value[:most]
        if isinstance(item, dict)
    ]


def _control_info(item: dict[str, Any]) -> CaseInfo:
    """A control case's identity; its tolerance comes with its inputs. (A nudge's ``nudge``
    says how the spec's child draws it, not what the case is.)"""
    fields = {key: item[key] for key in ("name", "dims", "dtype", "profile")}
    return CaseInfo(suite="custom", atol=0.0, rtol=0.0, **fields)


def _told_nudge(told: Any) -> dict[str, Any]:
    """What the spec's child said of a nudge it placed (``_draw`` there); empty unless well
    formed (a nudge with no place to compare at finds nothing)."""
    if not isinstance(told, dict):
        return {}
    index, used, ignored = told.get("index"), told.get("used"), told.get("ignored")
    numbers = [*index, used, ignored] if isinstance(index, list) else []
    if not numbers or not all(type(n) is int and n >= 0 for n in numbers):
        return {}
    return {"index": index, "used": used, "ignored": ignored}


def _unrunnable(wanted: list[dict[str, Any]], why: str) -> dict[str, RawCase]:
    done = {}
    for item in wanted:
        info = _control_info(item)
        done[info.name] = RawCase(info, [], "", failure="unrunnable", failure_detail=why)
    return done


def _control_round(
    wanted: list[dict[str, Any]],
    feed: _ReferenceFeed,
    runner: _CandidateRunner,
    executor: _Executor,
    workdir: Path,
) -> dict[str, RawCase]:
    """The control cases through the suite's children: the spec's child draws and computes
    them, the candidate's child exports each, the executor runs the artifact. A control the
    spec cannot serve — or any failure of the spec's child now — leaves it unrunnable."""
    done: dict[str, RawCase] = {}

    def give_up(raw: RawCase, why: str) -> None:
        raw.failure, raw.failure_detail = "unrunnable", why

    def next_for(raw: RawCase, expected: str) -> dict[str, Any] | None:
        message = feed.messages.get()  # the feed always ends with "done" or "spec_error"
        if message["event"] in ("spec_error", "done"):
            give_up(raw, str(message.get("message") or "the spec's child stopped answering"))
            feed.messages.put(message)  # every later control is unrunnable too
            return None
        if message.get("name") != raw.info.name:
            give_up(raw, f"the spec's child answered for another case: {message.get('name')!r}")
            return None
        if message["event"] == "case_unrunnable":
            give_up(raw, str(message.get("message", "")))
            return None
        if message["event"] != expected:
            give_up(raw, f"unexpected message from the spec's child: {message['event']}")
            return None
        return message

    exported = []
    for item in wanted:
        raw = RawCase(_control_info(item), reference=[], reference_tree="")
        done[raw.info.name] = raw
        filed = next_for(raw, "case_inputs")
        if filed is None:
            continue
        raw.info.atol, raw.info.rtol = (float(t) for t in filed["tolerance"])
        raw.nudged = _told_nudge(filed.get("nudged"))
        keep = workdir / "artifacts" / f"{raw.info.key}.bin"
        artifact, _ = runner.export(raw, filed["avals"], keep, [])
        if artifact is not None:
            inputs = Path(filed["dir"]) / "inputs.npz"
            executor.submit(partial(executor.run, raw, artifact, inputs))
        exported.append(raw)
    for raw in exported:
        ready = next_for(raw, "case_ready")
        if ready is None:
            continue
        raw.reference, extra = load_arrays(Path(ready["dir"]) / "reference.npz")
        raw.reference_tree = extra["treedef"]
        raw.input_arrays = _kept_inputs(Path(ready["dir"]) / "inputs.npz")
    executor.finish()
    return done


def _answered_again(
    child: SandboxChild, request: dict[str, Any], restart: Callable[[], SandboxChild]
) -> tuple[SandboxChild, str | None]:
    """A spec's child with the spec loaded, for control rounds after a kept answer
    (``truth_cache`` keeps the answer, not the child's state; a control is drawn from its own
    key, so the child skips the suite's cases): ``child``, or the one ``restart`` started when
    it died first (the feed closed the dead one), and why it could not load the spec (None: it
    did)."""
    feed = _ReferenceFeed(child, {**request, "controls_only": True}, restart)
    feed.thread.join()
    assert feed.child is not None  # a feed given a child keeps one
    last = feed.answer[-1]
    failed = None if last["event"] == "done" else str(last.get("message") or "no answer")
    return feed.child, failed


def describe_spec(spec: Path, limits: Limits | None = None) -> dict[str, Any]:
    """The spec's ``name``, ``category``, ``description`` and ``targets``, read in the spec's
    sandboxed child: the engine never runs spec code itself. UsageError (one line) for a spec
    that does not load."""
    workdir = scratch_dir(REFERENCE_PREFIX)
    child = None
    try:
        child = start_spec_child(workdir, limits or Limits(), "cpu")
        child.send(
            cmd="prepare",
            seed=0,
            suite="compact",
            describe_only=True,
            **spec_request(workdir, spec.resolve()),
        )
        try:
            message = child.receive(child.limits.reference_timeout_s)
        except ChildFailure as exc:
            raise UsageError(f"the spec's child failed: {exc}") from exc
        if message["event"] == "spec_error":
            raise UsageError(str(message.get("message", "the spec does not load")))
        if message["event"] != "spec":
            raise UsageError(f"unexpected message from the spec's child: {message['event']}")
        return {key: message.get(key) for key in ("name", "category", "description", "targets")}
    finally:
        if child is not None:
            child.kill()
            child.close()
        remove_tree(workdir)


def run_sandboxed(
    spec: Path,
    candidate: Path,
    suite: str,
    seed: int,
    limits: Limits,
    platform: str = "cpu",
    audit: bool = True,
    execute: bool = True,
    select: dict[str, Any] | None = None,
    entry: Entry = KERNEL,
    source: str | None = None,
    targets: tuple[str, ...] | None = None,
    controls: ControlPlanner | None = None,
    inputs_to: Path | None = None,
    profile_runs: int | None = None,
    hidden: bool = False,
    show_at: Path | None = None,
) -> RawRun:
    """Run the spec's cases of ``suite`` against the candidate, each side in its own child.

    With ``audit`` the run also gathers integrity evidence: the reference's work per case, the
    candidate's jaxpr audit, whether inputs survive the call, and input-independence probes on
    the first case. Without ``execute`` only the spec is read: the candidate never starts.
    ``select`` picks one named or custom case instead of the suite (see ``selection``; a request
    the spec does not allow is a UsageError saying what it allows); ``entry`` says what the
    untrusted child does with each case — run the kernel by default. ``source`` is the
    candidate's text as admitted; every child that runs it gets that text (or, without it, one
    copy of the file taken now), never the path again, which could have changed since.
    ``targets`` (else the spec's own, else interpret only) adds each target's checks
    (``runner.target_plan``): their evidence is on each case's ``targets``. ``controls``, once
    the suite's cases are in, names control cases to run in one more round of the same
    children (no audit, no targets), and once more for what those call for: their raw results
    are the run's ``controls``. ``inputs_to``: each case's inputs file is copied there, under
    the case's key (``runner.edit_screen`` runs edits of the kernel on them). ``profile_runs``:
    warm runs timed per suite case, of the kernel and of the reference (``runner.timing``;
    default: some on a device, none in CPU emulation). ``hidden``: with suite ``all``, the
    spec's child adds the hidden cases it draws from ``seed`` (``nearmiss.engine.hidden``):
    for a certifying check only, never a fixer's screening.
    """
    spec, candidate = spec.resolve(), candidate.resolve()
    profile_runs = profile_runs_for(platform, profile_runs) if entry.artifact else 0
    spec_text = read_spec(spec)  # read once: what is keyed is what the spec's child reads
    asked = dict(
        cmd="prepare",
        seed=seed,
        suite=suite,
        integrity=audit,
        select=select,
        controls=controls is not None and execute and entry.artifact,
        profile_runs=profile_runs if execute else 0,
        hidden=hidden and suite == "all" and select is None,
    )
    key = truth_cache.entry_key(spec_text, {**asked, "shown": str(spec)}, platform, limits)
    # A kept answer needs no spec child: a waiting spare is left for the next check. Else the
    # child an earlier check of this spec left with the spec loaded, else a spare.
    kept_before = key is not None and truth_cache.has(key)
    started_under = spares.key(REFERENCE_MODULE, limits, platform)
    same_spec = spares.spec_identity(spec_text, spec.name)
    reference = None
    if not kept_before:
        reference = spares.take(REFERENCE_MODULE, limits, platform, same_spec) or spares.take(
            REFERENCE_MODULE, limits, platform
        )
    workdir = spares.root(reference) if reference is not None else scratch_dir(REFERENCE_PREFIX)
    snapshot = workdir / "candidate" / candidate.name
    shown, candidate = candidate, snapshot
    label = check_label()  # drawn now: nothing of the candidate's has run yet
    executor = _Executor(limits, platform, label)
    # Target compiles take seconds; they get their own executor, to overlap with the runs.
    judge = _Executor(limits, platform, label, keeps=False)
    runner = _CandidateRunner(candidate, limits, platform, entry, shown, label)
    if show_at is not None:  # the user's folder, where a checkout's candidate really lives
        runner.shows_code_at = show_at
    feed: _ReferenceFeed | None = None
    finished = False  # every answer in: the spec's child may be kept (``spares.keep_spec``)
    spares.check_began()
    try:
        snapshot.parent.mkdir()
        if source is None:
            shutil.copyfile(shown, snapshot)
        else:
            snapshot.write_text(source)
        restart = partial(start_spec_child, workdir, limits, platform)
        from_spare = reference is not None
        request = {**asked, **spec_request(workdir, spec, spec_text)}
        kept = truth_cache.replay(key, workdir / "cases") if key and kept_before else None
        if kept is not None:  # the spec answered this before: no child unless controls need one
            feed = _ReferenceFeed(None, request, kept=kept)
        else:
            if reference is None:
                reference = restart()
            feed = _ReferenceFeed(reference, request, restart if from_spare else None)
        if execute:
            runner.start()  # overlaps the candidates's JAX import with the reference's work
        described = feed.next("spec")
        reference = feed.child  # a new one if the spare died
        chosen = choose_targets(targets, described.get("targets"))
        plans = plan_targets(chosen, on_device=platform != "cpu") if entry.artifact else []
        lower_for = lowerings(plans)
        if execute:
            runner.wait_ready()
            if entry.artifact:  # now, not with the others: three JAX start-ups on two cores
                executor.start()  # would slow all three; the first artifact is a while off
        cases, artifacts = [], []
        # The spec's child files every case's inputs before any reference: the candidate child
        # exports each case from its shapes while the references are computed.
        for item in described["cases"] if execute else []:
            atol, rtol = item.pop("tolerance")
            filed = feed.next("case_inputs")
            raw = RawCase(
                CaseInfo(atol=atol, rtol=rtol, **item),
                reference=[],
                reference_tree="",
                inputs=list(filed.get("inputs", [])),
                audited=audit,
            )
            cases.append(raw)
            artifact = None
            if entry.artifact:
                keep = workdir / "artifacts" / f"{raw.info.key}.bin"
                artifact, lowered = runner.export(raw, filed["avals"], keep, lower_for)
                if artifact is not None:  # runs at once: an artifact needs no reference
                    inputs = Path(filed["dir"]) / "inputs.npz"
                    executor.submit(partial(executor.run, raw, artifact, inputs, profile_runs))
                    for plan in plans:
                        raw.targets[plan.target] = {}
                        if plan.structure in lowered:
                            found = lowered[plan.structure]
                            judge.submit(partial(judge.judge, raw, plan, found, shown.name, inputs))
            artifacts.append(artifact)
        for raw, artifact in zip(cases, artifacts, strict=True):
            ready = feed.next("case_ready")
            raw.reference, extra = load_arrays(Path(ready["dir"]) / "reference.npz")
            raw.reference_tree = extra["treedef"]
            raw.reference_warm_s = _seconds(ready.get("reference_warm_s"))
            if profile_runs and raw.reference_warm_s is None:
                why = ready.get("reference_profile_error") or "no reference time"
                raw.reference_profile_error = f"reference: {why}"[:200]
            probe_dirs = {}
            if audit:
                raw.reference_work = ready.get("reference_work")
                for probe in ready.get("probes", []):
                    probe_dir = Path(probe["dir"])
                    probe_ref, _ = load_arrays(probe_dir / "reference.npz")
                    raw.probes.append(Probe(probe["input"], probe_ref))
                    probe_dirs[probe["input"]] = probe_dir
            inputs = Path(ready["dir"]) / "inputs.npz"
            raw.input_arrays = _kept_inputs(inputs)
            if inputs_to is not None:
                (inputs_to / raw.info.key).mkdir(parents=True, exist_ok=True)
                shutil.copy(inputs, inputs_to / raw.info.key / "inputs.npz")
            if artifact is not None:  # every export is done: the child may see values now
                for plan in plans:
                    if plan.emulated:
                        # The target's arithmetic with NaN in fresh memory, then float32 with
                        # values nobody wrote there (``runner.tpu_semantics``).
                        evidence = raw.targets[plan.target]
                        evidence["semantics"] = runner.under_tpu_semantics(
                            raw, inputs, plan.target, seed, fill="nan", numerics="chip"
                        )
                        evidence["semantics_fill"] = runner.under_tpu_semantics(
                            raw, inputs, plan.target, seed, fill="arbitrary", numerics="exact"
                        )
            if not entry.artifact:
                runner.run(raw, inputs, probe_dirs)
            elif artifact is not None and probe_dirs:
                executor.submit(partial(executor.probe, raw, artifact, inputs, probe_dirs))
        executor.finish()
        judge.finish()
        _held_to_limits(cases, (runner, executor, judge))
        if key and execute and not feed.kept:
            feed.thread.join(timeout=30)  # "done" follows the last reference at once
            truth_cache.keep(key, feed.answer, workdir / "cases")
        run = RawRun(
            op=described["name"],
            category=described["category"],
            description=described["description"],
            platform=described["platform"],
            jax_version=described["jax_version"],
            cases=cases,
            targets=chosen,
            notes=[str(n)[:300] for n in described.get("hidden_notes") or []][:8],
            domains={str(k): str(v)[:40] for k, v in (described.get("domains") or {}).items()},
        )
        live = not feed.kept  # a child that answered the request waits for control rounds
        for _ in range(
            CONTROL_ROUNDS if controls is not None and execute and entry.artifact else 0
        ):
            assert controls is not None  # no rounds without a planner
            wanted = controls(cases, dict(run.controls))
            if not wanted:
                break
            feed.thread.join()  # a feed ends at "done"; each round gets its own
            # A round asked before of the same request is kept too: its cases are drawn from
            # their own keys, so the answer depends on the request and the cases asked alone.
            round_key = truth_cache.round_key(key, wanted) if key else None
            kept = truth_cache.replay(round_key, workdir / "cases") if round_key else None
            if kept is not None:
                feed = _ReferenceFeed(None, kept=kept)
                run.controls |= _control_round(wanted, feed, runner, executor, workdir)
                continue
            try:
                if not live:  # a live child, to answer the request again and then controls
                    try:
                        reference = reference or restart()
                    except (UsageError, OSError) as exc:
                        raise ChildDied(f"could not be started: {exc}") from exc
                    reference, failed = _answered_again(reference, request, restart)
                    if failed:
                        raise ChildDied(failed)
                    live = True
                assert reference is not None  # the live child, or the one just started
                reference.send(cmd="controls", cases=wanted)
            except ChildFailure as exc:  # the spec's child is gone: no control can run
                run.controls |= _unrunnable(wanted, f"the spec's child failed: {exc}")
                break
            feed = _ReferenceFeed(reference)
            run.controls |= _control_round(wanted, feed, runner, executor, workdir)
            if round_key is not None:
                feed.thread.join(timeout=30)  # "done" follows the round's last case at once
                truth_cache.keep(round_key, feed.answer, workdir / "cases")
        finished = True
        return run
    finally:
        runner.stop()
        for stage in (executor, judge):
            stage.work.put(None)  # an early exit: let the thread end before its child goes
            if stage.thread is not None:
                stage.thread.join(timeout=60)
            stage.release()
        keeps_spec = (
            finished
            and feed is not None
            and feed.child is not None
            and feed.child is reference
            and feed.answered_all()
            and spares.keep_spec(reference, started_under, platform, same_spec)
        )
        if feed is not None and not keeps_spec:
            # The reference child may still be working (an early return or a usage error). Kill
            # it and let the feed thread see the end of its pipe *before* the pipe is closed:
            # a thread left reading a closed descriptor would read whatever reuses the number.
            if feed.child is not None:
                feed.child.kill()
            feed.thread.join(timeout=30)
            reference = feed.child or reference  # a dead spare replaced; or a child for controls
        if reference is not None and not keeps_spec:
            reference.kill()
            reference.close()
        if not keeps_spec:
            remove_tree(workdir)
        spares.refill_after(limits, platform)  # for the next check, if cores are free


__all__ = [
    "KERNEL",
    "Entry",
    "Limits",
    "RawCase",
    "RawRun",
    "UsageError",
    "describe_spec",
    "run_sandboxed",
]
