"""The controller run directory: the run record, metrics, plots and the end-of-run report read from it."""
