"""The demo: the stdlib through the queue, a worker SIGKILLed midway, every job reconciled."""
