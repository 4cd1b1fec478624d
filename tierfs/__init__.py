"""tierfs: tiered storage for append-only segments.

Layering (imports flow one way): errors/names/config/records -> journal, metadata,
chunkstore, blockcache, tail -> reader, storage_writer, recovery -> store -> cli and
the front ends (tierfs.fuse, tierfs.fsspec_impl). Only the public API is re-exported.
"""

__version__ = "0.1.0"  # before the imports: modules below read it

from .config import StoreConfig as StoreConfig
from .config import load_config as load_config
from .errors import TierFSError as TierFSError
from .store import DirectoryInfo as DirectoryInfo
from .store import SegmentInfo as SegmentInfo
from .store import SegmentStore as SegmentStore
from .store import open_store as open_store

