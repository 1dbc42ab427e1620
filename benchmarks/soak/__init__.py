"""The chaos soak: worker processes under injected faults, and a checker that
verifies the whole recorded history (see README.md in this directory).
"""
