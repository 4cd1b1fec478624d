"""The ``fsspec`` benchmark: ``command`` (reads and appends through the daemon next to the
engine), ``child`` (the process reading through ``tierfs://``) and ``writes`` (the write
rounds).
"""
