"""`python -m stepwise ARGS`: the command line, as the `stepwise` command runs it."""

from ._cli import main

if __name__ == "__main__":
    main()
