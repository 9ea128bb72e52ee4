"""The ``nearmiss`` command: ``main`` parses and dispatches; one module per command group
(``fleet``, ``kb``, ``replay``, ``report``, ``spec``, ``experiment``, ``workers``, ``demo``),
shared options in ``options``."""
