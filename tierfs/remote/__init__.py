"""Clients of a daemon: the HTTP client, the remote store for the CLI, direct chunk
reads. Imports contracts and blocks only, never the engine or the server."""
