"""The ``followers`` benchmark (``command``; its follower processes and the ceiling ``child``)."""
