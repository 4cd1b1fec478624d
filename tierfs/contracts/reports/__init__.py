"""What a store reports to its front ends, as plain values: a segment's ``stat``/``ls``
facts, ``fsck`` and ``gc`` reports, and the store's statistics. Every front end (HTTP,
FUSE, CLI, clients) shows the same values; none of these modules imports anything of
tierfs beyond ``contracts``."""
