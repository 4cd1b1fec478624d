"""Offload to the long-term store (Pulsar PIP-17): the attempt protocol, long-term
reads, the object format, and the policy and retention planning."""
