from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import close_opened


@pytest.fixture(autouse=True)
def _close_services() -> Iterator[None]:
    yield
    close_opened()
