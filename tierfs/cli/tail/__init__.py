"""``tierfs tail``: GNU tail's options (``options``), where a segment's bytes come from
(``source``: the daemon serving the data dir or the store in process) and the command
itself (``command``)."""
