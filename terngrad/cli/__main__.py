"""``python -m terngrad.cli``: the ``terngrad`` command."""

import sys

from terngrad.cli import main

sys.exit(main())
