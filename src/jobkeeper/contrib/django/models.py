"""No models: jobkeeper's tables come from its own migrations. The module is
here because Django sends ``post_migrate`` only to apps that have one (see
:mod:`jobkeeper.contrib.django.apps`).
"""
