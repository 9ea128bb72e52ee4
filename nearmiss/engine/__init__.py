"""The engine: one check of one candidate against one spec, with no Temporal, database or model.

``check.check`` is its front door (the CLI's ``nearmiss check``, the activities' checks): the
spec (``spec``) and candidate (``inputs``) are read, run in sandboxed children (``runner``),
judged against the reference (``forensics``), for cheating (``integrity``) and on the user's
targets (``targets``), and condensed into a ``models.CheckReport``. ``tools`` are the agent's
experiments over the same runner; ``authoring`` helps write and calibrate specs.
"""
