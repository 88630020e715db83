"""PyTorch: ``adapter.TorchBackend`` on torch tensors and autograd; the engine is torch.distributed (Gloo, NCCL).

The package itself is framework-free: the registry reads ``BACKEND`` without importing
the framework.
"""

from multigpu.contract.declaration import BackendDeclaration

BACKEND = BackendDeclaration(
    name="torch",
    adapter="multigpu.backends.torch.adapter:TorchBackend",
    framework="torch",
    extra="torch",
    engine="multigpu.backends.torch.process_group",
)
