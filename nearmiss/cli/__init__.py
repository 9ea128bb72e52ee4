"""The ``nearmiss`` command: ``main`` parses and dispatches; one module per command group
(``fleet``, ``kb``, ``replay``, ``report``, ``spec``, ``experiment``, ``workers``, ``demo``),
shared options in ``options``."""

from nearmiss.engine.runner.blas_threads import one_blas_thread

# Before anything imports NumPy: the command's processes (and the workers and children it
# starts) compute on one BLAS thread, unless the environment says otherwise.
one_blas_thread()
