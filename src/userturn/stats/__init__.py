"""Rates with intervals that respect the design, and rates corrected for the labeller's errors."""
