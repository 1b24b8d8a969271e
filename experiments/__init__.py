"""Experiments: entry point, configs, runners; benchmarks in bench/ (not
installed)."""
