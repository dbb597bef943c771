"""``python -m controller.simulator``."""

from controller.simulator.cli import main

raise SystemExit(main())
