"""What the test packages share: the test database and raw SQL on it
(:mod:`support.db`), waiting on conditions with a deadline
(:mod:`support.waiting`), the named JobQueue settings (:mod:`support.settings`)
and the ``jobkeeper`` command run in-process (:mod:`support.cli`).

Importable as ``support`` because ``tests/`` has no ``__init__.py``: pytest puts
it on ``sys.path`` (rootdir-relative "prepend" import mode), as it does for
``e2e.helpers`` and ``worker.helpers``.
"""
