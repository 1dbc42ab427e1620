"""Background services with one lifecycle: heartbeat, rescuer, pruner (internal)."""
