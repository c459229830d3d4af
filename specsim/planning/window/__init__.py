"""Which speculation window (k) to run: the best k per load and the crossover load where
speculation stops paying (``window``), the k-by-batch-size table (``window_table``) and the
trees tried beside the chains (``window_trees``), each with its report.
"""
