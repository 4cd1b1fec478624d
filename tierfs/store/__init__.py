"""The store façade: builds the engine's parts, hands each its narrow ports, and exposes
the public async API (``facade.SegmentStore``, ``facade.open_store``). ``served`` is the
protocol the server and the mount are written against: importing it loads no engine
module, so the front ends' types come without the engine."""
