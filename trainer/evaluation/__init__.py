"""Evaluation: loss by position, needles, effective length, the short-context guard, stage gates."""
