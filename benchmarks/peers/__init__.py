"""The ``peers`` benchmark: ``command`` (the steps and the report), ``mounts`` (the systems
and how each is mounted), ``operations`` (what is timed through every mount), ``proxy``
(the counting proxy in front of S3) and ``report`` (cells, rows, tables).
"""
