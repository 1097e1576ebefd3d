"""``python -m tileplan``: the same command line as the ``tileplan`` script."""

from tileplan.cli import main

main()
