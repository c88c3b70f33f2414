"""``python -m autotune.cli``: the CLI, as the ``autotune`` command runs it."""

import sys

from autotune.cli import main

sys.exit(main())
