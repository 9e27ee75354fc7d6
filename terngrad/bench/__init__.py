"""Benchmarks: codec timings against ``tensor.half()`` and the quantizer comparison."""
