"""The software version, written into offload index objects and reported by the CLI."""

__version__ = "0.1.0"
