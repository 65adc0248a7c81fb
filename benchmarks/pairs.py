"""How many back-to-back pairs a figure takes, for every benchmark script (imported by each, importing none)."""

DEFAULT_REPEAT = 9
"""Pairs per figure unless `--repeat` says otherwise."""
EMPTY_CELL_PAIRS_FACTOR = 5
"""A sample is a fraction of a second and the target is 1 %: take more pairs than elsewhere."""
RESTART_PAIRS_FACTOR = 3
"""A plain restart itself moves in steps of 0.1 s (jupyter_client polls the old kernel's exit): more pairs."""
