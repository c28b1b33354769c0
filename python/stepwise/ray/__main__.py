"""`python -m stepwise.ray`: one stage over a Ray cluster (see `python -m stepwise.ray --help`)."""

import sys

from stepwise.ray._cli import main

if __name__ == "__main__":
    sys.exit(main())
