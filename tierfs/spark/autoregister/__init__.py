"""Installed as the top-level package ``pyspark_tierfs`` (setup.py): PySpark >= 4.0
registers the ``DefaultSource`` of every installed package whose name starts with
``pyspark_`` when a session first looks a data source up, so ``format("tierfs")`` works
in any session on a machine where tierfs is installed, without ``register(spark)``
(which still works, and is needed only where tierfs is not installed on the driver's
Python)."""

from tierfs.spark.source import TierDataSource as DefaultSource

__all__ = ["DefaultSource"]
