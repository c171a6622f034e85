"""``python -m cuforge`` runs the ``cuforge`` command line."""

from cuforge.cli import main

raise SystemExit(main())
