"""fsspec plugin of tierfs (installed as ``tierfs.fsspec_impl``)."""
