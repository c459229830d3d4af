"""``python -m specsim.docs``: rewrite (or ``--check``) docs/reference/."""

import sys

from specsim.docs import main

sys.exit(main())
