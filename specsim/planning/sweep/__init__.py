"""The sweep machinery every plan runs on: the points to simulate (``points``), how one runs
(``tasks``) in this process, a local pool or a Dask cluster (``sweeper``, ``cluster``), the cheap
screen that skips hopeless points (``screen``) and the bisection on a load knob (``search``).
"""
