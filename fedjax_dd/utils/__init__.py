"""fedjax_dd.utils."""
