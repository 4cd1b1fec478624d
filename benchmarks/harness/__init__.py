"""The machinery every benchmark shares, one job per module:

- ``scenario``: the command's run: scratch directory on a real disk, the machine, the
  report (sections, tables, checks) on stdout and its figures as JSON;
- ``figures``: throughput, latency, percentiles, targets (``Check``), seeded payloads;
- ``procfs``: CPU, memory and scheduler figures of processes, from ``/proc``;
- ``child``: child processes that answer JSON lines;
- ``s3``: the S3 server (s3rver) and the raw s3fs ceilings of a read from it;
- ``stores``: writing and scanning segments in-process and through the API;
- ``cold_scan``: a cold sequential read in a fresh process (its peak RSS its own);
- ``fuse``: ``dd``, FUSE mount processes and unmounting;
- ``minimal_fs``: the minimal pyfuse3 filesystem, the ceiling and floor of FUSE here;
- ``spark``: Spark sessions and the timing of one job.

Daemons and mounts of tierfs itself come from ``tierfs.testing.harness``.
"""
