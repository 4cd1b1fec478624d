"""The daemon: the HTTP API over the store façade, served by hypercorn on trio."""
