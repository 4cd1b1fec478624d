"""The faults the reliability tests inject from outside tierfs, each at one boundary:

- ``fault_proxy``: an HTTP proxy in front of an S3 server that answers 503 SlowDown,
  resets, stalls and goes unreachable on demand (tier-2 and the long-term store);
- ``lossy_proxy``: a proxy in front of a daemon's socket that swallows the answers to
  appends it committed (a client retrying what already happened);
- ``lazyfs``: a FUSE file system that keeps unsynced writes in memory and drops them
  on demand (a power loss under the journal), and fills up on demand (disk full).

``fault_proxy`` and ``lazyfs`` are also programs (``python -m
tierfs.testing.faults.NAME``) for a test that needs them in their own process. Nothing
in tierfs outside ``tierfs.testing`` imports this package.
"""
