"""Test support shipped with tierfs, for its own tests and benchmarks and for anyone
who tests code built on tierfs, or a new chunk storage.

- ``harness``: real ``tierfs serve`` / ``tierfs mount`` processes, ready when started,
  never outliving their caller; ``small_config``;
- ``storages``: chunk storages that wrap a real one and fail on demand or count reads;
- ``crash``: make a daemon kill itself (SIGKILL) at a named crash point;
- ``contract``: the checks every ``ChunkStorage`` implementation must pass;
- ``warm_start``: the harness's processes forked from an interpreter that imported
  tierfs once (for the suite: ~0.35 CPU-s less per daemon);
- ``faults``: what the reliability tests inject from outside tierfs: S3 faults, lost
  answers, a disk that loses unsynced writes or fills up.

Layering: this package may import every other part of tierfs (it drives the whole
system); nothing in tierfs imports it. No module here imports pytest: users install
tierfs without the test extras. Import the modules themselves (nothing is re-exported
here), so that importing one does not load the others' dependencies.
"""
