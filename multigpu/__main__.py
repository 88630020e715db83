"""``python -m multigpu`` runs the command line."""

import sys

from multigpu.cli import main

sys.exit(main())
