"""Micro-benchmarks of Logbus: ``python -m benchmarks.<name>``; see docs/benchmarks.md."""
