"""The ``cluster`` benchmark: ``command`` (metadata latency on PostgreSQL and SQLite,
namespace scaling) and ``daemons`` (append throughput, failover and tail latency with
real cluster daemons).
"""
