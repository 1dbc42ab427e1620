"""The worker: claims, executes and acknowledges jobs (internal; use JobQueue.run_worker)."""
