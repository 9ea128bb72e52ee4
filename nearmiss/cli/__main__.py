"""``python -m nearmiss.cli``: the ``nearmiss`` command."""

from nearmiss.cli.main import main

raise SystemExit(main())
