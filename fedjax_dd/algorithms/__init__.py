"""fedjax_dd.algorithms."""
