"""Which drafter to run: two or more drafters, each on its best window per load, side by side
(``swap``), and the report that compares them (``swap_report``).
"""
