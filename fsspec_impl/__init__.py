"""fsspec plugin of tierfs (installed as ``tierfs.fsspec_impl``; protocol ``tierfs``)."""

from .filesystem import TierFile as TierFile
from .filesystem import TierFileSystem as TierFileSystem
