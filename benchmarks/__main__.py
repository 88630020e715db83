"""``python -m benchmarks``: the same as ``multigpu bench``."""

import sys

from multigpu.benchmarks.harness import main

sys.exit(main())
