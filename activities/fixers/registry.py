"""Each kind of fixer (``workflows.models.FIXER_KINDS``) and how to build it from a ``--model``.

The workflows decide by what a fixer is (``FixerKind``: zero-token, chat model, a recording);
this is where a kind becomes a fixer. Fixers are imported when built: the chat model's pulls in
the OpenAI client, which a playbook worker never needs.
"""

from __future__ import annotations

from collections.abc import Callable

from activities.fixers.base import Fixer
from workflows.models import fixer_kind, model_argument, unknown_model


def _playbook(argument: str) -> Fixer:
    from activities.fixers.playbook import PlaybookFixer

    return PlaybookFixer()


def _search(argument: str) -> Fixer:
    from activities.fixers.search import SearchFixer

    return SearchFixer()


def _openai(argument: str) -> Fixer:
    from activities.fixers.openai_fixer import OpenAIFixer

    return OpenAIFixer(model=argument)  # endpoint and key: make_client


# By kind name. A recording (``replay:SESSION``) is no fixer: the repair activity answers from
# the recorded session itself (``activities.fixers.replay``).
BUILDERS: dict[str, Callable[[str], Fixer]] = {
    "playbook": _playbook,
    "search": _search,
    "openai": _openai,
}


def make_fixer(model: str) -> Fixer:
    """``playbook``, ``search`` (the playbook, then a screened mutation search) or
    ``openai:MODEL`` (endpoint and key from OPENAI_BASE_URL / OPENAI_API_KEY, or
    NEARMISS_OPENAI_BASE_URL / NEARMISS_OPENAI_API_KEY on top); ValueError for anything else."""
    build = BUILDERS.get(fixer_kind(model).name)
    if build is None:
        raise ValueError(unknown_model(model))
    return build(model_argument(model))
