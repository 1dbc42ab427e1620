"""jobkeeper for Django: a backend for Django's task framework and a
``manage.py jobkeeper_worker`` command.

Add ``"jobkeeper.contrib.django"`` to ``INSTALLED_APPS`` (for the command) and::

    TASKS = {"default": {"BACKEND": "jobkeeper.contrib.django.backend.JobkeeperBackend"}}

See :mod:`jobkeeper.contrib.django.backend` for the options.
"""
