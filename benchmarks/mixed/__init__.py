"""The ``mixed`` benchmark: ``command`` (the daemon's memory under load) and ``client``
(the writer, follower and reader processes).
"""
