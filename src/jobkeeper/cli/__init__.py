"""The command line: ``jobkeeper ...`` (Typer + Rich)."""
