"""``python -m tasklease.cli``: the ``tasklease`` command."""

import sys

from tasklease.cli import main

sys.exit(main())
