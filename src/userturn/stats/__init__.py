"""The statistics over a run's turns, in one place: rates with intervals that respect the design,
rates corrected for the labeller's errors, the summary rows by condition, perturbation effects,
run and variant comparisons, and the agreement between label sources. Only values in (records),
numbers out: ``report/`` renders them."""
