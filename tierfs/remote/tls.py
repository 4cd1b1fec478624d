"""What a client of a daemon over TLS (another daemon, the CLI, fsspec, a Spark task)
trusts (the daemon's side: ``server/listeners.server_context``).

Invariants:
- A client verifies the daemon's certificate and its host name
(``CERT_REQUIRED``, ``check_hostname``) against the CA file given (``--tls-ca``,
  ``TIERFS_CA``), else the system's CAs. There is no switch that turns verification off.
- One context per CA file and version of it, shared by every client of the process
  (loading a CA costs 25-40 ms): a replaced file is read again.
"""

from __future__ import annotations

import functools
import os
import ssl

from tierfs.contracts.errors import InvalidArgumentError

CA_ENV = "TIERFS_CA"  # the CA file a client trusts (the daemon's --tls-ca, for its own calls)


def client_context(ca_path: str = "") -> ssl.SSLContext:
    """A context that trusts ``ca_path`` (else ``TIERFS_CA``, else the system's CAs)."""
    ca = ca_path or os.environ.get(CA_ENV, "")
    try:
        found = os.stat(ca) if ca else None
        return _context(ca, (found.st_ino, found.st_mtime_ns, found.st_size) if found else (0, 0, 0))
    except (OSError, ssl.SSLError) as e:
        raise InvalidArgumentError(f"cannot load the CA file {ca!r} ({CA_ENV} or --tls-ca): {e}") from None


@functools.lru_cache(maxsize=16)
def _context(ca: str, version: tuple[int, int, int]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca or None)
