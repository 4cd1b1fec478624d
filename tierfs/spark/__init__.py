"""The Spark data source (``format("tierfs")``): batch and streaming reads, exactly-once
writes. Built on the remote client; executors never import the engine."""

from tierfs.spark.source import register as register
