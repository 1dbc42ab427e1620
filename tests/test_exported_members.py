"""The public namespace is exactly ``jobkeeper.__all__`` (the httpx check)."""

from __future__ import annotations

import types

import jobkeeper


def test_all_is_sorted_and_lists_every_public_name():
    public = sorted(
        name
        for name, value in vars(jobkeeper).items()
        if (not name.startswith("_") or name == "__version__")
        and not isinstance(value, types.ModuleType)
    )
    assert jobkeeper.__all__ == sorted(jobkeeper.__all__)
    assert jobkeeper.__all__ == public


def test_every_exported_name_resolves():
    for name in jobkeeper.__all__:
        assert getattr(jobkeeper, name) is not None


def test_the_contract_names_are_exported():
    for name in ("JobQueue", "Job", "Retry", "Discard", "current_job", "JobStatus"):
        assert name in jobkeeper.__all__
