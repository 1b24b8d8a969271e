"""fedjax_dd.distill."""
