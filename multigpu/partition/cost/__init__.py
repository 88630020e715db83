"""The cost model: per-choice figures, the arithmetic of one assignment, ``evaluate`` and
its records, the source report's matrix form, and the tables the solvers share."""
