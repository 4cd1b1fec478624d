"""Local Spark on a machine whose own hostname does not resolve (containers, minimal
images): Spark's JVM looks its host name up at start-up, before any session option is
read, and fails with ``JAVA_GATEWAY_EXITED`` (``UnknownHostException``) unless
``SPARK_LOCAL_IP`` says where to bind.

Invariant: ``bind_to_loopback_unless_configured`` only fills in what the user left
unset (``SPARK_LOCAL_IP``, ``SPARK_LOCAL_HOSTNAME``), so a configured cluster address is
never overridden; it must run before the first SparkSession of the process.
"""

from __future__ import annotations

import os

LOOPBACK = "127.0.0.1"


def bind_to_loopback_unless_configured() -> None:
    if "SPARK_LOCAL_IP" not in os.environ and "SPARK_LOCAL_HOSTNAME" not in os.environ:
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
