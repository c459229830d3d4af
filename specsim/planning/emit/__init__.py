"""What to write into each serving engine's configuration: the plan's recommendation
(``emit_choice``) as engine files (``emit``), per pool of a disaggregated choice (``emit_split``),
and the planned workload as the engines' load testers can send it (``emit_workload``).
"""
