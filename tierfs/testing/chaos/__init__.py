"""The randomized fault-and-feature harness: real daemons, every front end writing, a
seeded schedule of faults, and a ledger of every acknowledgement checked against the
promise of its durability level after every step (``runner``). Run it with
``python -m tierfs.testing.chaos --seed N --steps M``.

Layers: ``ledger`` (records, promises, the check) · ``writers`` (front ends) ·
``world`` (daemons, tier-2, the power-loss layer) · ``nemeses`` (the faults) ·
``runner`` (a run).
"""
