"""The ``scale`` benchmark: ``command`` (the store sizes, the report) and ``probe`` (one
fresh process per measurement).
"""
