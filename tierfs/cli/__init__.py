"""The ``tierfs`` command: ``parser`` (grammar and entry point, imports only contracts so
``tierfs --help`` is quick) and ``commands`` (one handler per subcommand against the
public API, and the one place errors become messages and exit codes)."""

from tierfs.cli.parser import main as main
from tierfs.cli.parser import run as run
