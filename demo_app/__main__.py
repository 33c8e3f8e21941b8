"""``python -m demo_app``: see demo_app/runner.py."""

import sys

from .runner import main

sys.exit(main())
