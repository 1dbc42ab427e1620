"""The command line: ``jobkeeper ...`` (Click + Rich)."""
