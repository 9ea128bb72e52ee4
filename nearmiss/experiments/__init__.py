"""The debug-vs-regenerate experiment and its ablations (``nearmiss experiment``).

``config``  arms, near-miss selection, the experiment's configuration
``runner``  the sessions (RepairWorkflow / RegenerateWorkflow) and the experiment's events
``audit``   re-checks of the ablations' successes (gate enforced, full suite)
``table``   the table, computed from recorded event payloads only (pure)
``records`` reading experiments back from the event log
``render``  Markdown, CSV, JSON and SVG outputs
``cli``     the command: ``add_parser(commands)`` and ``run(args)``
"""
