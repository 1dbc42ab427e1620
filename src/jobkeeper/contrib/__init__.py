"""Glue for frameworks: each imports the public API only (``jobkeeper.contrib.django``)."""
