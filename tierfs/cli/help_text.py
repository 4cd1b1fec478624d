"""What ``tierfs --help`` ends with: the exit codes, the environment variables and one
short example per command (each subcommand's ``--help`` ends with its own).

Invariants: plain text, imports nothing (``tierfs --help`` stays quick); every
environment variable tierfs reads is listed here (``tests/test_cli.py`` greps the
sources for ``TIERFS_*`` names and checks).
"""

from __future__ import annotations

EXIT_CODES = """\
exit codes:
  0  success
  1  the operation failed (one line on stderr says why and what to do; -v adds the traceback)
  2  bad usage: an unknown command or option, a bad value (e.g. --length -5, size=lots)
  3  fsck found damage
  4  the data directory is in use by another process (a daemon: stop it, or let the
     command go through it; tierfs serve/mount while one runs)
  5  another data dir owns tier-2 (owned_elsewhere: tierfs owner, tierfs takeover)
  6  the data dir's disk is full (no_space)
  130 interrupted (Ctrl-C)"""

ENVIRONMENT = """\
environment:
  TIERFS_DATA_DIR     data directory (default $XDG_DATA_HOME/tierfs or ~/.local/share/tierfs)
  TIERFS_URL          the daemon to talk to: unix:///path/tierfs.sock or http://HOST:PORT
                      (--url; --data-dir wins over it)
  TIERFS_TOKEN        bearer token for an http:// TIERFS_URL (in <data-dir>/token of its host)
  TIERFS_CA           CA certificate(s) to trust for an https:// TIERFS_URL (--tls-ca)
  TIERFS_CONFIG       TOML config file (--config)
  TIERFS_TIER2        tier-2 URL (--tier2)
  TIERFS_METADATA     metadata database: sqlite: or postgresql://... (--metadata)
  TIERFS_OFFLOAD_TO   long-term store URL (--offload-to)
  TIERFS_CONTAINERS   cluster mode: number of segment containers
  TIERFS_TAKEOVER     1: claim tier-2 even if another owner holds it (--takeover)
  TIERFS_<SETTING>    any other setting (docs/operations.md), e.g. TIERFS_FLUSH_BYTES=4MiB,
                      TIERFS_FLUSH_INTERVAL_S=500ms (sizes and durations take units)
  TIERFS_JOURNAL_AIO  0: the journal syncs from a thread instead of through Linux native AIO
  TIERFS_CRASH_AT     tests only: the daemon kills itself at that crash point
  TIERFS_WARM_START   tests only: 1: the test harness forks its daemons from a warm interpreter
  XDG_DATA_HOME       the default data dir's parent
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, ...: S3 credentials/endpoint
  PYSPARK_PYTHON, SPARK_LOCAL_IP: Spark (tierfs fills them in for local sessions)"""

UNITS = """\
sizes and durations: 4k, 64MiB, 1GiB (K, M, G = KiB, MiB, GiB; KB, MB, GB = powers of
1000; a bare number is bytes); 500ms, 30s, 5m, 4h, 1h30m, 30d (a bare number is seconds).
Global options (--data-dir, --url, --json, -v, ...) go before or after the command."""

# one line per command: what a newcomer types first
EXAMPLES: dict[str, str] = {
    "create": "tierfs create -p logs/app.log --durability vd",
    "append": 'tierfs append logs/app.log "hello"        # prints the offset',
    "cat": "tierfs cat logs/app.log --offset 1MiB --length 4k",
    "stat": "tierfs stat logs/app.log --json",
    "ls": "tierfs ls -l logs",
    "mkdir": "tierfs mkdir -p logs/2026",
    "rmdir": "tierfs rmdir logs/2026",
    "seal": "tierfs seal logs/app.log",
    "unseal": "tierfs unseal logs/app.log",
    "rm": "tierfs rm logs/old.log",
    "mv": "tierfs mv logs/app.log logs/old.log",
    "concat": "tierfs concat logs/all.log logs/old.log",
    "sync": "tierfs sync logs/app.log",
    "flush": "tierfs flush",
    "fsck": "tierfs fsck",
    "gc": "tierfs gc --dry-run",
    "defrag": "tierfs defrag logs/app.log",
    "lost-found": "tierfs lost-found restore lost+found/logs/app.log.e000007",
    "tail": "tierfs tail -f logs/app.log",
    "offload": "tierfs offload logs/2026-11-20.log",
    "offload-status": "tierfs offload-status logs/2026-11-20.log --wait",
    "policy": "tierfs policy set logs offload_after_s=1h retention_s=30d offload_hot_bytes=1GiB",
    "takeover": "tierfs takeover",
    "owner": "tierfs owner --json",
    "restore": "tierfs restore --tier2 s3://bucket/tier2 --data-dir /var/lib/tierfs",
    "cluster": "tierfs --config /etc/tierfs/cluster.toml cluster drain host-b",
    "metadata": "tierfs metadata export backup.tfm",
    "serve": "tierfs serve --listen 127.0.0.1:7070 &",
    "mount": "tierfs mount ~/tierfs",
    "umount": "tierfs umount ~/tierfs",
    "completion": "source <(tierfs completion bash)",
}


def examples_text() -> str:
    width = max(map(len, EXAMPLES))
    lines = [f"  {name:{width}}  {example}" for name, example in EXAMPLES.items()]
    return "examples:\n" + "\n".join(lines)


def main_epilog() -> str:
    return "\n\n".join((UNITS, examples_text(), EXIT_CODES, ENVIRONMENT))


def command_epilog(name: str) -> str:
    example = EXAMPLES.get(name)
    lines = [f"example:\n  {example}"] if example else []
    lines.append("Global options (--data-dir, --url, --json, -v, ...) go before or after the "
                 "command; tierfs --help lists them, the exit codes and the environment.")
    return "\n\n".join(lines)
