"""The package version: one source, read by setup.cfg and every ``--version``."""

__version__ = "0.1.0"
