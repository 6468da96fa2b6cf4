"""Demonstrations and the simulated cluster; only the ``demo`` command imports them."""
