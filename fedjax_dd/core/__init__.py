"""fedjax_dd.core."""
