"""Comparative benchmarks: one harness (``harness.py``), one module per benchmark.

Run them with ``multigpu bench [NAME ...] [--quick] [--out DIR]`` or, from a
checkout, ``python -m benchmarks``. Installed as ``multigpu.benchmarks``.
"""
