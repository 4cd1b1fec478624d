"""The ``tierfs`` command: ``parser`` (grammar and entry point, imports only contracts so
``tierfs --help`` is quick), ``execution`` (runs one parsed command), ``commands`` and
``tail`` (what each subcommand does, against the public API) and ``failures`` (the one
place errors become messages and exit codes)."""

from tierfs.cli.parser import main as main
from tierfs.cli.parser import run as run
