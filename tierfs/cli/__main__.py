"""``python -m tierfs.cli``: the same as the ``tierfs`` command."""

from tierfs.cli.parser import main

main()
