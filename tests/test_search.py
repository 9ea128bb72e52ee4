"""The ``search`` fixer: single-site mutants of the code a kernel runs, screened by the engine.

The operators and the reach are pure (source in, mutants out) and tested on small sources; the
screening runs real sandboxed checks, on a kernel with a bug no recipe knows (its input refs
named in the wrong order).
"""

from __future__ import annotations

import ast
import importlib
import time
from pathlib import Path

import pytest

from activities.evidence import evidence_from_report
from activities.fixers.playbook import propose as playbook_propose
from activities.fixers.playbook.source import _apply, _Edit
from activities.fixers.search import SearchFixer, candidate_edits, suspected_lines
from activities.fixers.search.mutants import _Statements, mutants, reachable
from activities.fixers.search.screen import Budget, Screen, _rank, _Reached
from nearmiss.engine.check import check
from nearmiss.engine.forensics.classify import CONSTANT_FACTOR_LEAD, ROW_FACTOR_LEAD
from nearmiss.engine.models import Evidence
from workflows.models import FixRequest

HERE = Path(__file__).parent / "search"
SPEC = HERE / "axpy_spec.py"
SWAPPED = HERE / "axpy_swapped_refs.py"

KERNEL = """
import functools
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _body(x_ref, y_ref, o_ref, *, n):
    i = pl.program_id(0)
    row = jnp.maximum(x_ref[...], 0.0)[:, None]
    keep = jnp.where(i < n, row, 0.0)
    o_ref[...] = jnp.sum(keep.T, axis=0) + y_ref[...]


def _unused(x):
    return jnp.minimum(x, 1.0)


class Runner:
    def __call__(self, x, y):
        return pl.pallas_call(
            functools.partial(_body, n=4),
            grid=(4, 2),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(x, y)


make = functools.partial(Runner)


def kernel(x, y):
    return make()(x, y)
"""


def _changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    pairs = zip(before.splitlines(), after.splitlines(), strict=True)
    return [(a.strip(), b.strip()) for a, b in pairs if a != b]


def test_the_reach_follows_partials_aliases_and_classes_but_not_unused_code():
    names = [f.name for f in reachable(ast.parse(KERNEL))]
    assert names[-1] == "kernel"  # the user's glue is searched last
    assert {"_body", "__call__", "kernel"} == set(names)  # not _unused
    assert reachable(ast.parse("def other():\n    pass\n")) == []  # no entry point: nothing


def test_each_mutant_changes_one_site_and_parses():
    found = list(mutants(KERNEL))
    assert len(found) == len({m.source for m in found})  # each source once
    for m in found:
        ast.parse(m.source)
        assert len(_changed_lines(KERNEL, m.source)) == 1, m.description
        assert f"line {m.line}:" in m.description


@pytest.mark.parametrize(
    ("operator", "before", "after"),
    [
        ("transpose", "keep.T", "jnp.sum(keep, axis=0)"),
        ("extremum", "jnp.maximum(x_ref", "jnp.minimum(x_ref"),
        ("select", "jnp.where(i < n, row, 0.0)", "jnp.where(i < n, 0.0, row)"),
        ("broadcast", "[:, None]", "[None, :]"),
        ("comparison", "i < n", "i <= n"),
        ("off_by_one", "i < n", "i < n - 1"),
        ("swap", "def _body(x_ref, y_ref, o_ref", "def _body(y_ref, x_ref, o_ref"),
        ("swap", "grid=(4, 2)", "grid=(2, 4)"),
        ("axis", "axis=0", "axis=1"),
    ],
)
def test_operators_make_the_edit_a_near_miss_needs(operator, before, after):
    """Each operator's family includes the inverse of a typical planted bug."""
    edits = [_changed_lines(KERNEL, m.source)[0] for m in mutants(KERNEL) if m.operator == operator]
    assert any(before in old and after in new for old, new in edits), edits


BLOCKS = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _runs(q_index, q_block, kv_index, kv_block):
    return q_index * q_block >= kv_index * kv_block


def _body(x_ref, o_ref, *, block):
    j = pl.program_id(0)
    tile = x_ref[pl.ds(j, block)]
    acc = jnp.zeros((block,), jnp.float32)
    acc = acc + tile
    acc /= block
    rows = jax.lax.broadcast_in_dim(jnp.sum(tile, axis=-1), o_ref.shape, (1,))
    o_ref[...] = jnp.where(_runs(j, block, 0, block), acc + rows, 0.0)


def kernel(x):
    return pl.pallas_call(_body, grid=(2,), out_shape=x)(x)
"""


@pytest.mark.parametrize(
    ("operator", "before", "after"),
    [
        ("stride", "x_ref[pl.ds(j, block)]", "x_ref[pl.ds(j * block, block)]"),
        ("pair_swap", "_runs(j, block, 0, block)", "_runs(0, block, j, block)"),
        ("axis", "o_ref.shape, (1,))", "o_ref.shape, (0,))"),
        ("square", "acc = acc + tile", "acc = acc + tile * tile"),
        ("arithmetic", "acc /= block", "acc *= block"),
    ],
)
def test_operators_for_strides_pairs_dimensions_and_squares(operator, before, after):
    """A slice at a block's index, a helper's two (index, size) pairs swapped, a row statistic
    broadcast along the lanes, a variance loop without its square: each has its inverse."""
    edits = [_changed_lines(BLOCKS, m.source)[0] for m in mutants(BLOCKS) if m.operator == operator]
    assert any(before in old and after in new for old, new in edits), edits
    described = [m.description for m in mutants(BLOCKS) if m.operator == "pair_swap"]
    assert any("`j, block, 0, block` -> `0, block, j, block`" in d for d in described), described


MASKS = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _body(q_ref, k_ref, o_ref):
    s = q_ref[...] @ k_ref[...].T
    keys = jnp.arange(s.shape[-1])[None, :]
    mask = (keys >= 0) & (keys < 300)
    scale = jnp.float32(0.125)
    s *= mask
    s *= scale
    m = s.max(axis=-1).mean()

    def mean_body(i, acc):
        return acc + s[i]

    def var_body(i, acc):
        return acc + s[i] * s[i]

    var = jax.lax.fori_loop(0, 8, mean_body, jnp.zeros(s.shape[-1]))
    total = jnp.sum(s, axis=-1, dtype=jnp.bfloat16)
    rows = jnp.max(s, axis=1)[:, None]
    cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
    o_ref[...] = jnp.exp(s - m) + var + total + rows + cols


def kernel(q, k):
    def o_index_map(batch, head, _):
        return (batch, 0, 0)

    spec = pl.BlockSpec((None, 8, 128), o_index_map)
    call = pl.pallas_call(_body, grid=(2, 4, 1), out_specs=spec, out_shape=q)
    return jax.vmap(call, in_axes=(1, 0))(q, k)
"""


@pytest.mark.parametrize(
    ("operator", "before", "after"),
    [
        ("unused_parameter", "return (batch, 0, 0)", "return (batch, head, 0)"),
        ("multiplied_mask", "s *= mask", "s = jnp.where(mask, s, 0.7 * jnp.finfo(s.dtype).min)"),
        ("extremum", ".mean()", ".sum()"),
        ("name", "fori_loop(0, 8, mean_body,", "fori_loop(0, 8, var_body,"),
        ("narrow_dtype", "dtype=jnp.bfloat16)", "dtype=jnp.float32)"),
        ("axis", "in_axes=(1, 0)", "in_axes=(0, 0)"),
        ("logic", "(keys >= 0) & (keys < 300)", "(keys >= 0) | (keys < 300)"),
        (
            "axis",
            "broadcasted_iota(jnp.int32, s.shape, 0)",
            "broadcasted_iota(jnp.int32, s.shape, 1)",
        ),
        (
            "kept_axis",
            "axis=-1, dtype=jnp.bfloat16)",
            "axis=-1, dtype=jnp.bfloat16, keepdims=True)",
        ),
    ],
)
def test_operators_for_index_maps_masks_and_reductions(operator, before, after):
    """An index map that ignores a grid axis, a boolean mask multiplied into logits, a mean
    where a sum belongs, the wrong loop body handed to ``fori_loop``, an accumulation asked in
    bfloat16, a vmap over the wrong axis, key positions counted along the rows, a row statistic
    that lost its axis: each has its inverse, and only there — an ``_``-named parameter is
    unread on purpose, a factor that is not a comparison is no mask, and a reduction already
    given its ``[:, None]`` keeps no more axes."""
    made = [m for m in mutants(MASKS) if m.operator == operator]
    edits = [_changed_lines(MASKS, m.source)[0] for m in made]
    assert any(before in old and after in new for old, new in edits), edits
    if operator == "unused_parameter":
        # Either literal 0 may be the one, and ``head`` the only candidate: never ``_``.
        assert [new for _, new in edits] == ["return (batch, head, 0)", "return (batch, 0, head)"]
    if operator == "multiplied_mask":
        assert len(made) == 1  # not `s *= scale`
    if operator == "kept_axis":
        assert not any("[:, None]" in old for old, _ in edits), edits


REBOUND = """
import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl


def _body(x_ref, m_ref, o_ref, *, sm_scale):
    x = x_ref[...]
    scale = 1.44269504
    if sm_scale != 1.0:
        scale = sm_scale
    x *= scale
    m, m_next = m_ref[0], m_ref[1]
    p = jnp.exp(x - m_next)
    o_ref[...] = p / jnp.sum(p) * jnp.exp(m_next - m) + p.max()


def kernel(x, m):
    row_len = x.shape[0]
    body = functools.partial(_body, sm_scale=0.5)
    return pl.pallas_call(body, grid=(row_len // 8,), out_shape=x)(x, m)
"""


@pytest.mark.parametrize(
    ("operator", "before", "after"),
    [
        ("operand_swap", "jnp.exp(m_next - m)", "jnp.exp(m - m_next)"),
        ("rebinding", "scale = sm_scale", "scale *= sm_scale"),
        ("rebinding", "x *= scale", "x = scale"),
        ("axis", "row_len = x.shape[0]", "row_len = x.shape[-1]"),
        ("kept_axis", "p / jnp.sum(p)", "p / jnp.sum(p, axis=-1, keepdims=True)"),
        ("kept_axis", "p.max()", "p.max(axis=-1, keepdims=True)"),
    ],
)
def test_operators_for_reversed_differences_rebindings_and_whole_reductions(
    operator, before, after
):
    """A rescale exponent reversed, a factor set where it was to be folded in, a length read
    from the wrong dimension, a row's denominator summed over the whole tile: each has its
    inverse; a name's first binding is never made a fold (``x = x_ref[...]`` stays)."""
    made = [m for m in mutants(REBOUND) if m.operator == operator]
    edits = [_changed_lines(REBOUND, m.source)[0] for m in made]
    assert any(before in old and after in new for old, new in edits), edits
    if operator == "rebinding":
        assert not any("x_ref[...]" in old or "1.44269504" in old for old, _ in edits), edits


def test_for_a_nan_the_lines_that_can_make_one_are_edited_first():
    """NaN evidence points the search at exponentials, divisions and infinities; the order
    among those edits stays, and other evidence changes nothing."""
    first = suspected_lines("nan_inf")
    lines = REBOUND.splitlines()
    ordered = list(mutants(REBOUND, suspicion=lambda n: first(lines[n - 1])))
    suspect = [first(lines[m.line - 1]) for m in ordered]
    assert any(suspect) and not all(suspect)
    assert suspect == sorted(suspect, reverse=True), suspect  # all suspects, then the rest
    plain = list(mutants(REBOUND))
    assert sorted(m.source for m in ordered) == sorted(m.source for m in plain)
    assert [m for m in plain if first(lines[m.line - 1])] == ordered[: sum(suspect)]
    assert suspected_lines("wrong_values") is None
    assert first("p = jnp.exp(x - m)") and first("m = -float('inf')") and first("a / b")
    assert not first("acc += x  # exp later")


def test_for_outputs_off_by_a_factor_the_lines_that_scale_or_normalise_are_edited_first():
    """Where the diagnosis says the outputs are the reference times a wrong factor (by row, or
    one for all), products, quotients and normalising reductions come first; a diagnosis that
    says only "values are wrong" sets no preference."""
    for lead in (f"{ROW_FACTOR_LEAD} (1 to 1009, rows", f"{CONSTANT_FACTOR_LEAD} 0.5 of the"):
        first = suspected_lines("wrong_values", f"{lead} ...) ... ")
        assert first("p /= l") and first("out = acc * l") and first("s = p.sum(axis=-1)")
        assert not first("i = pl.program_id(0)") and not first("o_ref[...] = acc  # / l")
    assert suspected_lines("wrong_values", "Values are wrong. 12/16 elements ...") is None
    first = suspected_lines("wrong_values", f"{ROW_FACTOR_LEAD} (0.5 to 2, rows ...)")
    lines = REBOUND.splitlines()
    ordered = list(mutants(REBOUND, suspicion=lambda n: first(lines[n - 1])))
    suspect = [first(lines[m.line - 1]) for m in ordered]
    assert any(suspect) and not all(suspect) and suspect == sorted(suspect, reverse=True)


STARTS = """
import functools

import jax
from jax.experimental import pallas as pl


def _body(x_ref, o_ref, *, causal):
    i = pl.program_id(1)
    row = x_ref[pl.ds(1, 8)]
    total = jax.lax.fori_loop(1, 4, lambda j, acc: acc + row[j], 0.0)
    o_ref[...] = row[1:] * total * i if causal else row


def kernel(x, causal=True):
    body = functools.partial(_body, causal=False)
    return pl.pallas_call(body, grid=(2, 2), out_shape=x)(x)
"""


@pytest.mark.parametrize(
    ("operator", "before", "after"),
    [
        ("axis", "pl.program_id(1)", "pl.program_id(0)"),
        ("off_by_one", "x_ref[pl.ds(1, 8)]", "x_ref[pl.ds(0, 8)]"),
        ("off_by_one", "fori_loop(1, 4,", "fori_loop(0, 4,"),
        ("off_by_one", "row[1:]", "row[0:]"),
        ("pinned_keyword", "partial(_body, causal=False)", "partial(_body, causal=causal)"),
    ],
)
def test_operators_for_grid_axes_first_elements_and_pinned_flags(operator, before, after):
    """A block index read from the wrong grid axis, a load, a loop or a slice that skips the
    first element, a flag hard-coded where the caller's was to be passed on; a literal keyword
    with no variable of its name (``grid=``) stays."""
    made = [m for m in mutants(STARTS) if m.operator == operator]
    edits = [_changed_lines(STARTS, m.source)[0] for m in made]
    assert any(before in old and after in new for old, new in edits), edits
    if operator == "pinned_keyword":
        assert len(made) == 1


KINDS = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

DIMS = (((1,), (1,)), ((), ()))


def _body(q_ref, k_ref, o_ref, m_ref, *, sm_scale):
    m_prev = m_ref[...]
    s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())))
    p = jnp.dot(q_ref[...], k_ref[...])
    s = jnp.where(s > 0, s, 0.0)
    scale = sm_scale
    alpha = jnp.exp(m_prev - s)
    acc = jnp.ones_like(p)
    o_ref[...] = acc * alpha * (1 / jnp.sum(p)) * scale

    @pl.when(pl.program_id(1) == 0)
    def _():
        m_ref[...] = jnp.full_like(m_prev, -jnp.inf)


def kernel(q, k):
    def o_map(b, o, i):
        return (b, b, 0)

    return pl.pallas_call(
        _body,
        grid=(2, 3, 4),
        in_specs=[pl.BlockSpec((8, 8), lambda b, o, i: (0, b)), None],
        out_specs=pl.BlockSpec((8, 8, 8), o_map),
        out_shape=q,
    )(q, k)
"""


@pytest.mark.parametrize(
    ("operator", "before", "after"),
    [
        ("sibling", "jnp.exp(m_prev - s)", "jnp.exp2(m_prev - s)"),
        ("sibling", "jnp.ones_like(p)", "jnp.zeros_like(p)"),
        ("fill", "jnp.where(s > 0, s, 0.0)", "jnp.where(s > 0, s, -jnp.inf)"),
        ("index_map_name", "lambda b, o, i: (0, b)", "lambda b, o, i: (0, o)"),
        ("index_map_name", "return (b, b, 0)", "return (b, o, 0)"),
        ("axis", "pl.program_id(1) == 0", "pl.program_id(2) == 0"),
        ("dot_dimensions", "(((1,), (1,)), ((), ()))", "(((1,), (0,)), ((), ()))"),
        ("dot_dimensions", "jnp.dot(q_ref[...], k_ref[...])", "jnp.dot(q_ref[...], k_ref[...].T)"),
        ("reciprocal", "scale = sm_scale", "scale = 1 / sm_scale"),
        ("reciprocal", "(1 / jnp.sum(p))", "jnp.sum(p)"),
    ],
)
def test_operators_for_exponent_bases_fills_index_map_names_and_contractions(
    operator, before, after
):
    """The held-out kinds: exp for exp2 in a rescale, ones for zeros in an init, a masked value
    given 0 for minus infinity, an index map reading the wrong grid parameter, an accumulator
    reset on another grid axis, a product contracted over the wrong axis or missing a
    transpose, a reciprocal dropped or one too many."""
    edits = [_changed_lines(KINDS, m.source)[0] for m in mutants(KINDS) if m.operator == operator]
    assert any(before in old and after in new for old, new in edits), edits


def test_an_edit_parses_if_and_only_if_its_statement_does():
    """The parse check reads the smallest statement holding the edit (an ``elif``'s with its
    ``if``, a decorator's with its function) and agrees with parsing the whole module."""
    source = (
        "import functools\n\n\n"
        "@functools.partial(print, sep='')\n"
        "def f(x, n):\n"
        "    if x < n:\n"
        "        y = (x +\n"
        "             n)\n"
        "    elif x > n:\n"
        "        y = x\n"
        "    return y\n"
    )
    lines = source.split("\n")
    statements = _Statements(ast.parse(source), lines)

    def at(line: int, old: str, new: str, last: int | None = None) -> _Edit:
        start = lines[line - 1].index(old.split("\n")[0])
        end_line = last or line
        end = lines[end_line - 1].index(old.split("\n")[-1]) + len(old.split("\n")[-1])
        return _Edit((line, start), (end_line, end), new)

    edits = [
        at(4, "sep=''", "sep='-'"),  # a decorator
        at(4, "sep=''", "sep=="),
        at(9, "x > n", "x >= n"),  # an elif's test
        at(9, "x > n", "x >"),
        at(7, "x +\n             n", "x - n", last=8),  # two lines made one
        at(7, "x +\n             n", "x -", last=8),
        at(11, "y", "y, x"),
        at(11, "y", "y x"),
    ]
    verdicts = []
    for edit in edits:
        edited = _apply(source, [edit])
        assert edited is not None
        verdicts.append(statements.parses(edited, edit))
        try:
            ast.parse(edited)
            whole = True
        except SyntaxError:
            whole = False
        assert verdicts[-1] == whole, (edit, edited)
    assert verdicts == [True, False] * 4


def test_unreached_code_is_never_mutated():
    changed = [_changed_lines(KERNEL, m.source)[0][0] for m in mutants(KERNEL)]
    assert not any("jnp.minimum(x, 1.0)" in old for old in changed)


def test_kernel_bodies_are_searched_before_the_code_that_builds_the_call():
    lines = KERNEL.splitlines()
    body = range(
        lines.index("def _body(x_ref, y_ref, o_ref, *, n):") + 1, lines.index("def _unused(x):")
    )
    order = [m.line in body for m in mutants(KERNEL)]
    assert order[0] and False in order
    assert order == sorted(order, reverse=True)  # every body mutant before any other


def _request(source: str, tried=(), controls: bool = False) -> FixRequest:
    report = check(SPEC, _write(source), "compact", 3, controls=controls)
    assert not report.certified
    return FixRequest(
        spec_path=str(SPEC),
        spec_source=SPEC.read_text(),
        source=source,
        candidate_name="kernel.py",
        evidence=evidence_from_report(report, "sha256:x", ""),
        round=1,
        tried=list(tried),
    )


_TMP: list[Path] = []


def _write(source: str) -> Path:
    path = _TMP[0] / "kernel.py"
    path.write_text(source)
    return path


@pytest.fixture(autouse=True)
def _scratch(tmp_path):
    _TMP[:] = [tmp_path]
    yield


async def test_the_search_repairs_a_bug_no_recipe_knows_with_zero_tokens(tmp_path):
    source = SWAPPED.read_text()
    request = _request(source, controls=True)  # the controls find x and y swapped
    assert playbook_propose(request).source is None or playbook_propose(request).reason
    result = await SearchFixer(Budget(checks=16)).propose(request)
    assert result.model == "search" and result.tokens.total == 0
    assert result.summary.startswith("mutant:swap:"), result.reason
    assert "passes the screening suite" in result.reason
    assert "it edits where the evidence points (x and y reach lines" in result.reason
    assert check(SPEC, _write(result.source), "all", 5).certified  # the full suite agrees


async def test_a_recipe_for_the_class_is_screened_first_and_answered_unscreened_only_if_none_can_be(
    monkeypatch,
):
    """The recipe for the evidence's class (a grid that rounds down, for NaN evidence) is the
    first edit screened, judged like the others: where a mutant passes and the recipe does not,
    the mutant is the answer. Only where screening cannot run (the gate refuses the kernel) is
    the recipe answered unscreened, as the playbook would."""
    import activities.fixers.search as search_module

    evidence = Evidence(
        candidate_hash="sha256:x", suite="compact", certified=False, failure_class="nan_inf"
    )
    request = FixRequest(
        spec_path=str(SPEC),
        spec_source=SPEC.read_text(),
        source=REBOUND,
        candidate_name="kernel.py",
        evidence=evidence,
        round=1,
    )
    recipe = playbook_propose(request)
    assert recipe.summary == "ceil_div_grid" and not recipe.reason  # the class's recipe applies
    screened: list[str] = []

    def third_passes(request, sources, budget):
        screened.extend(source for _, source in zip(range(3), sources, strict=False))
        return Screen(3, 1.0, best=2, passed=True)

    monkeypatch.setattr(search_module, "screen", third_passes)
    answer = await SearchFixer().propose(request)
    assert screened[0] == recipe.source and answer.source == screened[2] != recipe.source
    assert answer.summary.startswith("mutant:") and answer.model == "search"

    def refused(request, sources, budget):
        return Screen(0, 0.1, why="the integrity gate refuses to run the kernel")

    monkeypatch.setattr(search_module, "screen", refused)
    answer = await SearchFixer().propose(request)
    assert answer.source == recipe.source and answer.summary == "ceil_div_grid"
    assert "unscreened" in answer.reason and answer.model == "search"


async def test_a_spent_budget_says_what_it_screened_and_proposes_nothing_worse():
    source = SWAPPED.read_text()
    request = _request(source)
    skip = [e.name for e in candidate_edits(request) if e.name.startswith("mutant:swap:")]
    result = await SearchFixer(Budget(checks=2)).propose(_request(source, tried=skip))
    assert "search: screened 2 edits" in result.reason and "more were left" in result.reason
    # only an edit that got further than the kernel on the failing suite, if any
    assert result.source is None or "gets further than the kernel" in result.reason


def test_a_search_that_spent_its_round_goes_on_where_it_stopped(monkeypatch):
    """A round that finds nothing says how far it got (``resume_at``); asked again with that
    as ``skip``, the next screens the edits after those, so rounds add up instead of screening
    the same ones; with none left, there is nowhere to go on from. (The screening itself is
    replaced: it takes three edits a round and finds nothing.)"""
    import activities.fixers.search as search_module

    screened: list[list[str]] = []

    def three_and_nothing(request, sources, budget):
        screened.append([source for _, source in zip(range(3), sources, strict=False)])
        return Screen(len(screened[-1]), 1.0)

    monkeypatch.setattr(search_module, "screen", three_and_nothing)
    request = _request(SWAPPED.read_text())
    order = [e.source for e in candidate_edits(request)]
    first = search_module.search(request, Budget())
    assert screened[-1] == order[:3] and first.resume_at == 3 and first.source is None
    assert "screened 3 edits in 1 s (more were left)" in first.reason
    second = search_module.search(request.model_copy(update={"skip": 3}), Budget())
    assert screened[-1] == order[3:6] and second.resume_at == 6
    assert "(after 3 in earlier rounds; more were left)" in second.reason
    last = search_module.search(request.model_copy(update={"skip": len(order) - 2}), Budget())
    assert screened[-1] == order[-2:] and last.resume_at == 0 and "none was left" in last.reason
    # An edit proposed from the first round (the loop built on it, then came back to this
    # kernel) is tried now: the edits after it keep their places, none is passed over, and
    # a later one tried is not screened again.
    names = [e.name for e in candidate_edits(request)]
    again = request.model_copy(update={"skip": 3, "tried": [names[1], names[4]]})
    assert search_module.search(again, Budget()).resume_at == 7
    assert screened[-1] == [order[3], order[5], order[6]]


def test_an_edit_that_only_got_further_says_where_the_search_of_its_kernel_goes_on(monkeypatch):
    """The loop may come back to the unedited kernel after building on an edit that got further
    (``workflows.loop``): the answer says how far the search got, as a round with no edit does."""
    import activities.fixers.search as search_module

    def second_gets_further(request, sources, budget):
        list(zip(range(3), sources, strict=False))
        return Screen(3, 1.0, best=1)

    monkeypatch.setattr(search_module, "screen", second_gets_further)
    request = _request(SWAPPED.read_text())
    order = [e.source for e in candidate_edits(request)]
    answer = search_module.search(request.model_copy(update={"skip": 2}), Budget())
    assert answer.source == order[3] and "gets further than the kernel" in answer.reason
    assert answer.resume_at == 5


# A second body behind a dispatch the suite never takes (inputs of over a million rows), full of
# sites the operators edit before they reach the swap that repairs the body that does run.
DISPATCHED = (
    SWAPPED.read_text()
    .replace("def kernel(x, y):", "def _small(x, y):")
    .replace(
        "def _axpy_body(",
        "def _huge_body(x_ref, y_ref, o_ref):\n"
        "    s = jnp.maximum(x_ref[...], 0.0)\n"
        "    t = jnp.where(s < 1.0, s, y_ref[...]).T\n"
        "    o_ref[...] = jnp.minimum(t, s) if s.shape[0] > 1 else s.T\n\n\n"
        "def _huge(x, y):\n"
        "    return pl.pallas_call(_huge_body, out_shape=x)(x, y)\n\n\n"
        "def _axpy_body(",
    )
    + "\n\ndef kernel(x, y):\n    return _huge(x, y) if x.shape[0] > 2**20 else _small(x, y)\n"
)


def test_only_edits_of_statements_that_ran_are_kept():
    source = "def f(x):\n    if x:\n        return 1\n    return 2\n\n\ndef g():\n    return 3\n"
    reached = _Reached(source, frozenset({1, 2, 4, 7}))  # defs at import, f(0); g never ran
    assert reached.reached(source.replace("return 2", "return 5"))
    assert not reached.reached(source.replace("return 1", "return 5"))  # the branch not taken
    assert reached.reached(source.replace("if x:", "if not x:"))  # its test did run
    assert not reached.reached(source.replace("return 3", "return 5"))
    assert reached.reached(source.replace("def g():", "def g(y=0):"))  # a def runs at import
    assert _Reached(source, None).reached(source.replace("return 3", "return 5"))  # not known
    # A module-level constant runs at import, before the tracer starts: its edits are kept.
    constant = "N = 1\n\n\n" + source
    assert _Reached(constant, frozenset({4, 5, 7})).reached(constant.replace("N = 1", "N = 2"))


def test_a_module_level_constant_the_kernel_reads_is_mutated_after_its_functions():
    source = (
        "import jax\n\n"
        "DIMS = (((0,), (1,)), ((), ()))\n"
        "UNUSED = (((0,), (1,)), ((), ()))\n\n\n"
        "def kernel(q, k):\n"
        "    return jax.lax.dot_general(q, k, DIMS) + 1\n"
    )
    found = list(mutants(source))
    fixed = [m for m in found if "DIMS = (((1,), (1,)), ((), ()))" in m.source]
    assert fixed and fixed[0].operator == "dot_dimensions"
    assert not any("UNUSED = (((1,)" in m.source for m in found)  # no function reads it
    on_constant = [m.line == 3 for m in found]
    assert on_constant == sorted(on_constant)  # the function's own edits first


async def test_edits_of_code_the_suite_never_runs_are_skipped_unscreened():
    """The dispatch's other body holds a dozen edits the order puts before the repair; a budget
    of four screenings reaches the repair only because those are skipped."""
    request = _request(DISPATCHED)
    ahead = [e.name for e in candidate_edits(request)]
    fix = next(i for i, name in enumerate(ahead) if "`y_ref, x_ref` -> `x_ref, y_ref`" in name)
    assert fix > 8, ahead[:fix]
    result = await SearchFixer(Budget(checks=4)).propose(request)
    assert "passes the screening suite" in result.reason, result.reason
    assert "skipped as editing code the suite never ran" in result.reason
    assert check(SPEC, _write(result.source), "all", 5).certified


def test_a_guard_is_turned_off_only_after_every_other_edit():
    """Flipping ``if axis != last: raise`` makes a wrongly normalised axis pass a suite that
    only calls with the last axis, and breaks every call the guard let through: such edits are
    screened last, after the one that repairs the normalisation."""
    source = (
        "def kernel(x, axis=-1):\n"
        "    axis = axis if axis >= 0 else len(x.shape) - axis\n"
        "    if axis != len(x.shape) - 1:\n"
        "        raise NotImplementedError('trailing axis only')\n"
        "    return x\n"
    )
    order = [_changed_lines(source, m.source)[0][1] for m in mutants(source)]
    repair = order.index("axis = axis if axis >= 0 else len(x.shape) + axis")
    guard = [i for i, line in enumerate(order) if line.startswith("if ")]
    assert guard and repair < min(guard) and max(guard) == len(order) - 1


async def test_the_search_repairs_a_planted_bug_in_one_of_jaxs_kernels(tmp_path):
    """JAX's TPU matmul with its y tile transposed in the dot (held-out set 4): no recipe knows
    it; the search's first edit drops the transpose and the full suite certifies it."""
    from test_playbook_holdout4 import HOLDOUT4
    from test_playbook_shipped import SPECS, planted, repair_planted

    case = HOLDOUT4["matmul_y_tile_transposed"]
    spec = SPECS / f"{case.spec}_spec.py"
    _, report, steps = await repair_planted(
        spec, planted(case), tmp_path / "kernel.py", SearchFixer(Budget(checks=8))
    )
    assert report.certified, steps
    assert steps[1].startswith("mutant:transpose:"), steps


async def test_the_search_repairs_a_mean_normalised_twice_in_jaxs_layer_norm(tmp_path):
    """JAX's GPU layer norm with its mean loop reduced by ``.mean()`` and then divided by the
    count again (held-out set 7, written after it was measured): the first mutant, ``.mean``
    -> ``.sum``, certifies."""
    from test_playbook_holdout7 import HOLDOUT7
    from test_playbook_shipped import SPECS, planted, repair_planted

    case = HOLDOUT7["layer_norm_mean_normalised_twice"]
    spec = SPECS / f"{case.spec}_spec.py"
    _, report, steps = await repair_planted(
        spec, planted(case), tmp_path / "kernel.py", SearchFixer(Budget(checks=8))
    )
    assert report.certified, steps
    assert steps[1].startswith("mutant:extremum:line 47: `.mean` -> `.sum`"), steps


def test_of_two_edits_that_pass_a_one_case_spec_the_hidden_cases_choose_the_fix():
    """``!= 1`` (zero the accumulator on every block but the second) passes the one listed case
    as the fix does, and comes first: screening goes on past it, the hidden cases (more row
    blocks, from the spec's domain) refuse it, and the answer is the fix, naming what they
    refused."""
    spec = HERE / "col_sum_one_case_spec.py"
    source = (HERE / "col_sum_init_on_second.py").read_text()
    report = check(spec, _write(source), "compact", 3, controls=False)
    request = FixRequest(
        spec_path=str(spec),
        spec_source=spec.read_text(),
        source=source,
        candidate_name="kernel.py",
        evidence=evidence_from_report(report, "sha256:x", ""),
        round=1,
    )
    import activities.fixers.search as search_module

    result = search_module.search(request, Budget(checks=64))  # the screening, recipes aside
    assert "!= 1" not in result.summary, result.reason
    assert "passed the suite but not the hidden cases: mutant:comparison:" in result.reason
    assert "`pl.program_id(0) != 1`" in result.reason
    deeper = _TMP[0] / "deeper_spec.py"
    deeper.write_text(spec.read_text().replace('{"R": 64, "C": 128}', '{"R": 160, "C": 128}'))
    assert check(deeper, _write(result.source), "compact", 9).certified, result.source


def _slow_first(scores: dict[int, float]):
    """A lane judge whose earlier edits take longer: lanes finish out of the edits' order."""

    def judged(edits):
        time.sleep(0.05 * (10 - edits[0][0]))
        return [scores.get(index, 0.1) for index, _ in edits]

    return judged


def test_the_ranking_reads_the_lanes_in_the_edits_order_whichever_finishes_first():
    """Lanes of two edits, the later ones finishing first: the first passer in the edits'
    order wins, its rivals are those up to ``after_pass`` edits past it; with none passing,
    the first of the furthest."""
    edits = [(index, f"edit {index}") for index in range(10)]
    budget = Budget(lanes=2, after_pass=4, checks=10, seconds=60)
    found = _rank(edits, budget, 0.3, _slow_first({3: 1.0, 7: 1.0, 9: 1.0}), time.perf_counter(), 2)
    assert (found.best, found.passed) == (3, True)
    assert [index for index, _ in found.passers] == [3, 7]  # 9 is five past the first
    furthest = {1: 0.5, 2: 0.5, 6: 0.4}
    found = _rank(edits, budget, 0.3, _slow_first(furthest), time.perf_counter(), 2)
    assert (found.best, found.passed, found.screened) == (1, False, 10)


def test_edits_that_trace_to_a_program_already_judged_take_its_verdict_unrun(monkeypatch):
    """The kernel with a constant added that nothing reads traces to the kernel's own program
    (judged by the line tracer's run), the fix with a comment to the fix's: neither runs, and
    each is ranked as its program is. A factor changed is a program of its own."""
    from nearmiss.engine.runner.edit_screen import EditScreen

    screen_module = importlib.import_module("activities.fixers.search.screen")

    source = SWAPPED.read_text()
    fixed = source.replace(
        "def _axpy_body(y_ref, x_ref, o_ref):", "def _axpy_body(x_ref, y_ref, o_ref):"
    )
    quarter = fixed.replace("0.5 * y_ref", "0.25 * y_ref")
    edits = [source + "\nUNREAD = 1\n", quarter, fixed, fixed + "# the fix again\n", quarter]
    known: dict[int, list[bool]] = {}
    batch = EditScreen._batch

    def counted(self, *args, **kwargs):
        found = batch(self, *args, **kwargs)
        known.update({index: [case.known for case in cases] for index, cases in found.items()})
        return found

    monkeypatch.setattr(EditScreen, "_batch", counted)
    budget = Budget(checks=8, lanes=1, hidden_checks=0)
    found = screen_module.screen(_request(source), edits, budget)
    assert known == {-1: [False], 0: [True], 1: [False], 2: [False], 3: [True], 4: [True]}
    assert (found.best, found.passed) == (2, True)
    assert [index for index, _ in found.passers] == [2, 3]


# Two inputs through a wrapper, a dispatching body that takes its refs as ``*args`` and an
# index map written as a named function: k's path is marked ``# k``, q's alone ``# q``.
ATTEND = """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

DIMS = (((1,), (1,)), ((), ()))  # k


def _single(q_ref, k_ref, o_ref):  # k
    q = q_ref[...] * 0.5  # q
    k = k_ref[...]  # k
    s = jax.lax.dot_general(q, k, DIMS)  # k
    o_ref[...] = jnp.tanh(s)  # k


def _dispatch(q_ref, *refs):
    _single(q_ref, *refs)  # k


def _call(q, k):
    rows = q.shape[0]
    k = k * 1.0  # k

    def k_map(i):  # k
        return (0, 0)  # k

    return pl.pallas_call(
        _dispatch,
        grid=(rows // 8,),
        in_specs=[
            pl.BlockSpec((8, 128), lambda i: (i, 0)),  # q
            pl.BlockSpec((16, 128), k_map),  # k
        ],
        out_specs=pl.BlockSpec((8, 16), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, 16), jnp.float32),
    )(q, k)  # k


def kernel(q, k):  # k
    return _call(q, k)  # k
"""
ATTEND_SPEC = "def reference(q, k):\n    return q @ k.T\n"


def _ignores(name: str) -> str:
    """The engine's own sentence for a nudge of ``name`` the kernel ignores."""
    import numpy as np

    from nearmiss.engine.forensics import reach

    nudge = reach.Nudge("nudge-0", ("compact", "base"), name, 1, (0, 3))
    moved = np.full((4, 4), reach.MOVED, np.int8)
    said = reach.describe(nudge, np.zeros_like(moved), moved)
    assert said is not None and f"the kernel ignores {name}[0, 3]" in said
    return f"wrong_values: ... {said}"


def _ignoring_k() -> FixRequest:
    """A fix of ATTEND asked with evidence that the kernel ignores k."""
    evidence = Evidence(
        candidate_hash="sha256:x",
        suite="compact",
        certified=False,
        failure_class="wrong_values",
        diagnosis=_ignores("k"),
    )
    return FixRequest(
        spec_path="attend_spec.py",
        spec_source=ATTEND_SPEC,
        source=ATTEND,
        candidate_name="kernel.py",
        evidence=evidence,
        round=1,
    )


def _marked(source: str, mark: str) -> set[int]:
    return {n for n, line in enumerate(source.split("\n"), 1) if line.endswith(f"# {mark}")}


def test_the_lines_an_input_the_evidence_names_reaches_are_found_through_the_call():
    """From the entry point's parameter through a wrapper, the operand handed to pallas_call,
    its BlockSpec's named index map, a dispatcher's ``*refs`` and the body, to the module
    constant the body contracts by: every line of k's path, and none of q's alone."""
    from activities.fixers.search.leads import evidence_lines, named_inputs

    diagnosis = _ignores("k")
    assert named_inputs(diagnosis) == ("k",)
    found = evidence_lines(ATTEND, ATTEND_SPEC, diagnosis)
    assert found.inputs == ("k",)
    assert _marked(ATTEND, "k") <= found.lines, sorted(_marked(ATTEND, "k") - found.lines)
    assert not _marked(ATTEND, "q") & found.lines
    # The spec names the inputs: a kernel whose parameters are named otherwise is followed by
    # position, and a diagnosis that names no input points nowhere.
    renamed = ATTEND.replace(
        "def kernel(q, k):  # k\n    return _call(q, k)",
        "def kernel(a, b):  # k\n    return _call(a, b)",
    )
    assert evidence_lines(renamed, ATTEND_SPEC, diagnosis).lines == found.lines
    # The position decides, not the name: a kernel whose parameters are named the other way
    # round from the reference's gets the reference's k as its q.
    turned = ATTEND.replace(
        "def kernel(q, k):  # k\n    return _call(q, k)",
        "def kernel(k, q):  # k\n    return _call(k, q)",
    )
    assert evidence_lines(turned, ATTEND_SPEC, diagnosis).lines == found.lines
    assert not evidence_lines(ATTEND, ATTEND_SPEC, "wrong_values: Values are wrong.")
    assert "k reaches lines" in found.describe()


def test_edits_of_the_lines_a_named_input_reaches_are_screened_first():
    """With evidence that the kernel ignores k, the mutants of k's path come before all the
    others (the order among them kept), and before the recipes of other classes; without it,
    the order is the plain one."""
    request = _ignoring_k()
    path = _marked(ATTEND, "k")
    every = [e.name for e in candidate_edits(request)]
    names = [name for name in every if name.startswith("mutant:")]
    on_path = [int(name.split("line ")[1].split(":")[0]) in path for name in names]
    assert any(on_path) and not all(on_path)
    assert on_path == sorted(on_path, reverse=True), on_path
    # A recipe of another class (the grid rounded down is nan_inf's), merely matching the
    # source, comes after the lead's lines and before the other mutants.
    recipe = every.index("ceil_div_grid")
    assert recipe == sum(on_path), every[: recipe + 1]
    plain = [f"mutant:{m.operator}:{m.description}" for m in mutants(ATTEND)]
    assert sorted(plain) == sorted(names) and plain != names


def test_an_answer_says_whether_it_edits_where_the_evidence_points(monkeypatch):
    """The answer names the lines the evidence's input reaches and whether the edit is there;
    one elsewhere says why it is answered anyway: the edits there were screened first and none
    did as well. (The screening is replaced: it picks the edit it is told to.)"""
    import activities.fixers.search as search_module

    request = _ignoring_k()
    path = _marked(ATTEND, "k")
    lines = [
        int(e.name.split("line ")[1].split(":")[0]) if e.name.startswith("mutant:") else 0
        for e in candidate_edits(request)
    ]  # the mutants of k's path first, then the recipes' edits (line 0 here), then the rest
    first_on = next(i for i, line in enumerate(lines) if line in path)
    first_off = next(i for i, line in enumerate(lines) if line and line not in path)

    def picks(best):
        def screened(request, sources, budget):
            taken = [s for _, s in zip(range(best + 1), sources, strict=False)]
            return Screen(len(taken), 1.0, best=best, passed=True)

        return screened

    monkeypatch.setattr(search_module, "screen", picks(first_on))
    there = search_module.search(request, Budget())
    assert "it edits where the evidence points (k reaches lines" in there.reason, there.reason
    monkeypatch.setattr(search_module, "screen", picks(first_off))
    elsewhere = search_module.search(request, Budget())
    assert "it is not where the evidence points (k reaches lines" in elsewhere.reason
    screened_there = sum(line in path for line in lines[:first_off])
    assert f"none of the {screened_there} edits of those lines screened" in elsewhere.reason
