"""Contracts: what every layer agrees on and nothing more: errors, names, configuration,
value types, the public API protocol, the operation table and data-dir facts.
Imports nothing else of tierfs."""
