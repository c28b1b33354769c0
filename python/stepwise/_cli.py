"""The `stepwise` command line, shipped in the package: `pip install` puts a `stepwise` command on
the PATH that runs the Rust command line in the native module (as `python -m stepwise` does)."""

import signal
import sys


def main() -> None:
    from . import _stepwise

    # Ctrl-C stops the command as it stops the standalone binary (Python's own handler would only
    # run once the command returned); commands that handle it themselves (`serve`) still do.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_stepwise.cli(["stepwise", *sys.argv[1:]]))
