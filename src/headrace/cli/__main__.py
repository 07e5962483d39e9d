"""``python -m headrace.cli``: the ``headrace`` command where its console script is not on
``PATH`` (a venv not activated, a source checkout on ``PYTHONPATH``)."""

import sys

from headrace.cli import main

sys.exit(main())
