"""The ``spark`` benchmark: ``command`` (the raw scenario and the options), ``events`` (JSON
events), ``writes`` (its write rows) and ``ceiling`` (the in-memory Spark data sources
and sink; the only modules that import pyspark at their top).
"""
