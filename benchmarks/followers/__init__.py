"""The ``followers`` benchmark: ``command`` (the load, the checks, the report), ``child``
(the follower processes) and ``fanout`` (the minimal fan-out server, the ceiling).
"""
