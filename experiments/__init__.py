"""Experiments: entry point, configs, benchmarks."""
