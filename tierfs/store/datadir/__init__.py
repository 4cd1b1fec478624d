"""Work on a data dir that does not serve it: who owns its tier-2 (``tierfs owner``),
rebuilding it from tier-2 (``tierfs restore``), its metadata as a file (``tierfs metadata
export|import``) and its lost+found as the front ends list it. Each takes the data dir's
lock, or only reads, so it never races a daemon serving the same data dir."""
