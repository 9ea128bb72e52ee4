"""The bundled operators: each folder holds spec.py, golden.py and labelled variants.

``variants.json`` beside the spec lists each near-miss variant with its bug family, the failure
class the engine must report, and a one-line diagnosis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CORPUS_ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Variant:
    path: Path
    bug_family: str
    failure_class: str
    diagnosis: str


@dataclass(frozen=True)
class Operator:
    name: str
    spec: Path
    golden: Path
    variants: tuple[Variant, ...]


def load_operator(folder: Path) -> Operator:
    manifest = folder / "variants.json"
    entries = json.loads(manifest.read_text()) if manifest.is_file() else []
    variants = tuple(
        Variant(
            folder / "variants" / e["file"], e["bug_family"], e["failure_class"], e["diagnosis"]
        )
        for e in entries
    )
    return Operator(folder.name, folder / "spec.py", folder / "golden.py", variants)


def operators(root: Path = CORPUS_ROOT) -> list[Operator]:
    return [
        load_operator(folder)
        for folder in sorted(root.iterdir())
        if (folder / "spec.py").is_file() and (folder / "golden.py").is_file()
    ]
