"""PaddlePaddle: ``adapter.PaddleBackend`` on dygraph tensors; the engine is paddle.distributed (Gloo, NCCL).

The package itself is framework-free: the registry reads ``BACKEND`` without importing
the framework.
"""

from multigpu.contract.declaration import BackendDeclaration

BACKEND = BackendDeclaration(
    name="paddle",
    adapter="multigpu.backends.paddle.adapter:PaddleBackend",
    framework="paddle",
    extra="paddle",
    engine="multigpu.backends.paddle.process_group",
)
