"""How much load a deployment holds within the SLO: one replica's highest arrival rate per
candidate (``capacity``), the deployments compared (``capacity_deploy``), each deployment's
cheapest fleet and the Pareto frontier (``capacity_pareto``), and the disaggregated prefill and
decode pools (``disagg``, ``disagg_pareto``, ``capacity_split``), each with its report.
"""
