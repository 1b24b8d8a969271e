"""Experiment configs (ml_collections ConfigDicts, big_vision style)."""
