"""A third-party multigpu backend, registered by entry point (``mgpu_lenient-0.1.dist-info``).

The conformance suite puts this folder on ``sys.path``; ``importlib.metadata`` then
finds the distribution and ``multigpu.backend("lenient")`` loads it like any
installed adapter, without a line of multigpu knowing its name.
"""

from multigpu.contract.declaration import BackendDeclaration

BACKEND = BackendDeclaration(name="lenient", adapter="mgpu_lenient.adapter:LenientBackend")  # numpy only, no engine
