"""The engine's parts: journal, tail, metadata, chunk storage, block cache, read path,
storage writer, recovery. Each part depends only on the narrow ports it declares
(``ports``), never on the store façade."""
