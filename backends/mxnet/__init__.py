"""MXNet: ``adapter.MXNetBackend`` on NDArrays and ``mxnet.autograd``.

The engine is the kvstore ``dist_sync`` parameter server.

The package itself is framework-free: the registry reads ``BACKEND`` without importing
the framework.
"""

from multigpu.contract.declaration import BackendDeclaration

BACKEND = BackendDeclaration(
    name="mxnet",
    adapter="multigpu.backends.mxnet.adapter:MXNetBackend",
    framework="mxnet",
    extra="mxnet",
    engine="multigpu.backends.mxnet.process_group",
)
