"""Who may write: the data dir's lock, owner claims on tier-2 (epochs), fencing of a
store that lost its tier-2 to a newer owner, tenure (the lease an acknowledgement needs
in cluster mode), and metadata commits conditional on the owner's epoch.

Invariants:
- Two owners never hold one epoch: a claim is created exclusively and never changed.
- Fenced is forever (for the process): a fenced store writes, commits and deletes
  nothing more; its unflushed bytes go to lost+found.
- A commit guarded by an epoch lands entirely before a takeover or not at all.
- Tenure reads monotonic time only, and a lease only moves forward.
- A tier-2 failure while checking a claim delays a verdict; it never fences.

May import: the shared root modules, ``metadata``, ``tier2``, ``tierfs.contracts`` and
``tierfs.blocks``.
"""
