"""Evaluation: eval sets (uploaded or generated), eval runs and the metrics they score."""
