"""The ``fuse`` benchmark: ``command`` (``dd`` through a tierfs mount next to the minimal
pyfuse3 filesystem and raw s3fs) and ``sustained`` (the sustained VD write).
"""
