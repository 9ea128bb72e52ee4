"""The public API a spec author or a script imports: ``from nearmiss import ...``, and the old
paths that keep working with a warning."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import nearmiss
from conftest import OPS
from nearmiss.engine.check import check
from nearmiss.engine.spec import load_spec


def test_every_public_name_resolves_and_import_nearmiss_alone_loads_no_jax():
    assert set(nearmiss.__all__) == {"__version__", *nearmiss._PUBLIC}
    for name in nearmiss.__all__:
        assert getattr(nearmiss, name) is not None, name
    probe = (
        "import sys, nearmiss; assert 'jax' not in sys.modules and "
        "'nearmiss.engine' not in sys.modules, sorted(sys.modules); "
        "from nearmiss import Case, OpSpec, check, CheckReport; print(nearmiss.__version__)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == nearmiss.__version__
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        nearmiss.Nope  # noqa: B018


def test_a_spec_written_for_the_old_path_still_loads_and_certifies_with_a_warning(tmp_path):
    spec = tmp_path / "spec.py"
    old = (OPS / "leaky_relu" / "spec.py").read_text()
    assert "from nearmiss.engine.spec import Case, OpSpec" in old
    spec.write_text(old.replace("nearmiss.engine.spec", "nearmiss.spec"))
    sys.modules.pop("nearmiss.spec", None)  # warn again, whatever imported it before
    with pytest.warns(DeprecationWarning, match="from nearmiss import Case, OpSpec"):
        loaded = load_spec(spec)
    assert loaded.name == "leaky_relu"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        report = check(spec, OPS / "leaky_relu" / "golden.py", "compact", 1)
    assert report.certified, report.diagnosis
