"""Task modules the benchmark's worker subprocesses load (one per library)."""
