"""The ``spark`` benchmark (``command``, its ``events`` scenario, and ``ceiling``: the
in-memory data sources and sink, the only module importing pyspark at its top)."""
