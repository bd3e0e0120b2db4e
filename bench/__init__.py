"""Benchmark, soak and measurement tooling (not installed)."""
