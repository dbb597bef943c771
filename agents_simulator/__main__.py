"""``python -m agents_simulator``."""

from agents_simulator.cli import main

raise SystemExit(main())
