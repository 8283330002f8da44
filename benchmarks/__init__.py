"""Benchmark harness for jax_sparse_attn (``python -m benchmarks.run --help``).

Not part of the installed package: run it from the repository root.
"""
