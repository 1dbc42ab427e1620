"""``manage.py jobkeeper_worker`` and ``manage.py jobkeeper_migrate``."""
