"""`python -m stepwise.ray`: one stage over a Ray cluster (see `python -m stepwise.ray --help`)."""

import sys

from stepwise.ray._cli import main

sys.exit(main())
