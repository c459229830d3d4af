"""Planning: sweeps of simulations turned into answers (best k, capacity, drafter choice).

No torch here: the planner only runs the simulator and reads profiles.
"""

from specsim.planning.sweep.points import SweepPoint
from specsim.planning.sweep.search import Bisection, solve
from specsim.planning.sweep.sweeper import PointResult, Sweeper, simulate_point

__all__ = ["Bisection", "PointResult", "SweepPoint", "Sweeper", "simulate_point", "solve"]
