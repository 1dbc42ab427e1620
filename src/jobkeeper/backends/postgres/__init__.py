"""Internal: see backend.py."""
