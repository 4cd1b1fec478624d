"""The engine: one data dir's journal, metadata, tier-2 chunks, read path and background
work, in parts by job. Each part depends only on the narrow ports it declares
(``ports``) and on the parts below it, never on the store façade.

The parts, bottom to top (tests/test_layering.py holds the order; peers on one line
never import each other):
- the shared root modules: typed records and their protobuf codec (``records``,
  ``record_types``), object names (``object_keys``), clocks, crash points, durable
  renames, segment locks, the emergency space reserve;
- ``journal``: tier-1;
- ``metadata``: the records' database;
- ``tier2``: chunk storage over fsspec;
- ``ownership``: locks, owner claims, fencing, tenure, epoch-guarded commits;
- ``segments``: open segments in memory and the namespace table;
- ``ports``: what the parts above ask of each other;
- ``read``, ``flush``, ``upkeep``, ``recovery``, ``backup``;
- ``appender``: the append path, on ports.
"""
