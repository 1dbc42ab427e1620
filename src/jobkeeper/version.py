"""The package version (leaf module: the backends record it for each worker)."""

from __future__ import annotations

__version__ = "0.1.0"
