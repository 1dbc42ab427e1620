"""Django app config: lets ``INSTALLED_APPS`` find the management command."""

from __future__ import annotations

from django.apps import AppConfig


class JobkeeperConfig(AppConfig):  # type: ignore[misc]
    name = "jobkeeper.contrib.django"
    label = "jobkeeper"
    verbose_name = "jobkeeper"
