"""Measured comparisons, each a script that prints side-by-side ratios in one run."""
