"""jobkeeper's benchmark suite: figures, printed and recorded, never asserted."""
