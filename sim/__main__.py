"""`python -m sim`: see sim.cli."""

from sim.cli import main

raise SystemExit(main())
