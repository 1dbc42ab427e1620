"""Management commands: jobkeeper_worker, jobkeeper_migrate."""
