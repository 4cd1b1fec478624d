"""Verified 1 MiB blocks: CRC32C, the one verified-block check every reader uses, and
opening fsspec filesystems. Imports only contracts; shared by the engine and clients."""
