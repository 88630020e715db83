"""``python -m benchmarks``: the same as ``multigpu bench``."""
import sys

from .harness import main

sys.exit(main())
