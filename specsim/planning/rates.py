"""Arrival rate as a function of the capacity search's knob: the rate itself, or a trace's speed.

An open-loop workload is searched on ``workload.rate`` directly. A trace replay is searched on its
speed (``workload.time_scale`` = 1 / speed); the arrival rate it then offers is the number of trace
rows that fall inside the replay window divided by the window, read from the trace file itself
(numpy only), so capacities and targets are in requests per second either way.
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecsimError
from specsim.planning.common import LoadAxis


class ArrivalScale:
    def __init__(
        self,
        axis: LoadAxis,
        times: np.ndarray | None = None,
        duration_s: float | None = None,
        requests: int | None = None,
        source: str | None = None,
    ):
        self.axis = axis
        self.times = None if times is None else np.sort(np.asarray(times, dtype=np.float64))
        self.duration_s = duration_s
        self.requests = requests
        self.source = source

    @classmethod
    def for_scenario(cls, scenario, axis: LoadAxis) -> ArrivalScale:
        if axis.kind == "rate":
            return cls(axis)
        from specsim.workload import read_trace

        workload = scenario.workload
        trace = read_trace(scenario.resolve(workload.trace), workload.format)
        return cls(axis, trace.arrival_s, workload.duration_s, workload.requests, workload.trace)

    def rate(self, knob: float) -> float:
        """Requests per second offered at ``knob`` (a rate, or a trace speed)."""
        if self.times is None:
            return float(knob)
        count, window = self.replayed(knob)
        if count == 0 or window <= 0:
            return 0.0
        return count / window

    def replayed(self, knob: float) -> tuple[int, float]:
        """A trace at speed ``knob``: the rows its replay window holds, and the window (s)."""
        scaled = self.times / knob
        count = scaled.shape[0]
        if self.requests is not None:
            count = min(count, self.requests)
        if self.duration_s is not None:
            count = min(count, int(np.searchsorted(scaled, self.duration_s, side="left")))
            window = self.duration_s
        else:
            window = float(scaled[count - 1] - scaled[0]) if count else 0.0
        return count, window

    def knob(self, rate: float) -> float:
        """The smallest knob offering at least ``rate`` (bisection: ``rate`` is monotone in it)."""
        if self.times is None:
            return float(rate)
        lo, hi = 1e-6, 1e6
        if self.rate(hi) < rate:
            raise SpecsimError(
                f"the trace cannot offer {rate:g} req/s: at most {self.rate(hi):.4g} req/s fit "
                "in its replay window",
                file=self.source,
                key="workload.duration_s",
                fix="lengthen workload.duration_s, raise workload.requests or lower --target-rps",
            )
        for _ in range(200):
            mid = (lo * hi) ** 0.5
            if self.rate(mid) >= rate:
                hi = mid
            else:
                lo = mid
            if hi / lo < 1 + 1e-9:
                break
        return hi
