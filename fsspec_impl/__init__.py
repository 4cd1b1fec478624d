"""fsspec plugin of tierfs (installed as ``tierfs.fsspec_impl``; protocol ``tierfs``)."""

from tierfs.fsspec_impl.filesystem import TierFile as TierFile
from tierfs.fsspec_impl.filesystem import TierFileSystem as TierFileSystem
