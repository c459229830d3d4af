"""specsim's version, which the files it writes name (``specsim.__version__`` re-exports it).

A module of its own at the bottom of the layers, so that a part the API imports can name the
version without importing the ``specsim`` package, which imports the API.
"""

__version__ = "0.1.0"
