"""A request's state outside the batch arrays (and across preemptions)."""

from __future__ import annotations


class Request:
    """A request's state outside the batch arrays (and across preemptions)."""

    __slots__ = (
        "accepted",
        "admit_order",
        "arrival",
        "client",
        "drafted",
        "first_token",
        "generated",
        "level",
        "output",
        "preemptions",
        "prefill_target",
        "prefilled",
        "prompt",
        "rid",
        "scheduled",
        "steps",
    )

    def __init__(self, rid: int, arrival: float, prompt: int, output: int, client: int = -1):
        self.rid = rid
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.client = client
        self.scheduled = -1.0
        self.first_token = -1.0
        self.generated = 0
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.preemptions = 0
        self.level = -1
        self.prefill_target = prompt
        self.prefilled = 0
        self.admit_order = -1
