"""The store façade: builds the engine's parts, hands each its narrow ports, and
exposes the public async API (``SegmentStore``, ``open_store``)."""

from tierfs.store.facade import SegmentStore as SegmentStore
from tierfs.store.facade import open_store as open_store
