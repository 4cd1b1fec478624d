"""FUSE front end of tierfs (installed as ``tierfs.fuse``; never as top-level ``fuse``)."""
