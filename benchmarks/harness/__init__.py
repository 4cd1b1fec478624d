"""What every benchmark shares, one job per module: ``scenario`` (the command's run and
report), ``figures`` (throughput, latency, targets, payloads), ``procfs`` (CPU and
memory from /proc), ``child`` (child processes answering JSON lines), ``mounts`` (tierfs
daemons and mounts, other FUSE processes, ``dd``), ``s3`` (s3rver and the raw s3fs
ceilings), ``stores`` (segments written and read), ``cold_scan`` (a cold read in a fresh
process), ``minimal_fs`` (the minimal FUSE filesystem, ceiling and floor),
``line_timing`` (a ``tail -f`` follower timed line by line).
"""
