"""The soak tests drive ``benchmarks.soak`` (a package at the repository
root, which pytest does not put on ``sys.path`` by itself).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
