"""Sweeps: a grid of bench_train runs, on this machine or across a Ray cluster, resumable (wrappers/bench_sweep.py
is the recipe over these). One module per concern: ``spec`` the sweep file and its grid of points, ``point`` a point's
process tree and its outcome, ``state`` the sweep directory's state and the driver's loop, ``executor`` what runs the
points (``local_executor``, ``ray_executor``). Docs: docs/sweeps.md.
"""

from tuning.benchmarking.sweep.spec import Point, check_point_flags, grid, is_count, load_spec, predicted_ooms
from tuning.benchmarking.sweep.state import EXECUTORS, Sweep

__all__ = ["EXECUTORS", "Point", "Sweep", "check_point_flags", "grid", "is_count", "load_spec", "predicted_ooms"]
