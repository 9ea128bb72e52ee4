"""The pytest plugin (entry point ``pytest11``): certify kernels in a kernel repository's tests.

    def test_softmax(nearmiss):
        nearmiss.assert_certified("specs/softmax_spec.py", "kernels/softmax.py")

    @pytest.mark.nearmiss(targets=["interpret", "tpu-v5e"])
    def test_softmax_on_v5e(nearmiss):
        nearmiss.assert_certified("specs/softmax_spec.py", "kernels/softmax.py")

Relative paths are read from pytest's root directory. ``--nearmiss-targets LIST`` and
``--nearmiss-seed N`` set the defaults of the whole run; a marker's keywords win for its test.
Loading the plugin imports neither JAX nor the engine: the first check does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nearmiss", "certify kernels with nearmiss")
    group.addoption(
        "--nearmiss-targets",
        default=None,
        help="comma list of targets every nearmiss check judges (default: each spec's)",
    )
    group.addoption(
        "--nearmiss-seed",
        type=int,
        default=None,
        help="the seed every nearmiss check draws its inputs from (default: a fresh one)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "nearmiss(targets=None, suite='all', seed=None): how the nearmiss fixture checks kernels "
        "in this test",
    )


class Certifier:
    """The ``nearmiss`` fixture: checks with this test's defaults."""

    def __init__(self, root: Path, defaults: dict[str, Any]) -> None:
        self.root, self.defaults = root, defaults

    def _path(self, path: str | Path) -> Path:
        path = Path(path)
        return path if path.is_absolute() else self.root / path

    def assert_certified(self, spec: str | Path, candidate: str | Path, **how: Any) -> Any:
        """``nearmiss.testing.assert_certified`` with this test's targets, suite and seed."""
        from nearmiss.testing import assert_certified

        return assert_certified(self._path(spec), self._path(candidate), **{**self.defaults, **how})

    def check(self, spec: str | Path, candidate: str | Path, **how: Any) -> Any:
        """The check's report, certified or not (to assert on its findings)."""
        from nearmiss.testing import check_kernel

        return check_kernel(self._path(spec), self._path(candidate), **{**self.defaults, **how})


@pytest.fixture
def nearmiss(request: pytest.FixtureRequest) -> Certifier:
    """Certify kernels: ``nearmiss.assert_certified(spec, candidate)``."""
    config = request.config
    defaults: dict[str, Any] = {}
    targets = config.getoption("--nearmiss-targets")
    if targets:
        defaults["targets"] = [t for t in targets.split(",") if t]
    seed = config.getoption("--nearmiss-seed")
    if seed is not None:
        defaults["seed"] = seed
    marker = request.node.get_closest_marker("nearmiss")
    if marker is not None:
        defaults.update(marker.kwargs)
    return Certifier(Path(config.rootpath), defaults)
