"""The systems ``benchmarks peers`` compares, each mounted on the same s3rver through the
counting proxy: tierfs, s3fs-fuse, and rclone mount with ``--vfs-cache-mode`` off and
full; and the ceiling, a plain directory on the scratch disk (the set-up that installs
the peers and drops the page cache is ``peer_setup.py``).

Each system has its own bucket (its listings see only its own files) and is mounted
from a process this module starts and stops:

- tierfs: ``tierfs mount`` through the shared harness (``tierfs.testing.harness.Mount``),
  ``tier2_url = s3://tierfs/chunks`` (so flushed bytes live only in S3 and a cold read
  really comes from S3), the configured durability, a block cache that holds the
  whole cold file, default FUSE options (``direct_io``). Cold: the daemon is restarted
  (its block cache lives in its memory);
- s3fs: ``s3fs BUCKET M -f`` with path-style requests and ``notsup_compat_dir,
  enable_noobj_cache`` (without them it lists the directory on every create), no
  ``use_cache`` (no local cache survives a remount);
- rclone: ``rclone mount s3rver:BUCKET M`` with ``--vfs-cache-mode off`` or ``full``,
  its cache in the scratch directory (removed before every cold mount), ListObjects v1
  (``list_version = 1``: s3rver 3.7.1 answers a paginated ListObjectsV2 with 500) and
  ``no_head = true``: s3rver 3.7.1 answers a PUT before the object's file is written,
  so rclone's HEAD right after each upload sometimes gets 404 and rclone fails the
  file's close (ENOENT, after 1,209 and 3,536 small files in two runs with
  ``--vfs-cache-mode off``); on real S3 that check costs one HEAD per upload.

Invariants:
- ``mount_cold`` leaves no cache of the system's own: the process is new and its
  cache directory is empty; the kernel page cache is dropped when this process may
  (``drop_page_cache``), else the reason is reported.
- Every process started here is stopped by ``unmount`` (killed if it does not exit in
  time), so none outlives the benchmark.
"""

from __future__ import annotations

import abc
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import MiB, warm_cache_bytes
from benchmarks.peer_setup import drop_page_cache
from tierfs.testing.harness import HarnessError, Mount, wait_for_mount

if TYPE_CHECKING:
    from benchmarks.s3server import S3Endpoint

MOUNT_TIMEOUT_S = 60.0  # a mount whose store is s3rver, on a loaded 2-core machine
UNMOUNT_TIMEOUT_S = 300.0  # s3fs and tierfs upload what is pending before they exit
TIERFS_SEGMENT_PIECE_BYTES = 4 * MiB  # API appends that write the cold file
RCLONE_WRITE_BACK_S = 5.0  # rclone's default --vfs-write-back: uploads start this long after close


class PeerError(RuntimeError):
    """A system could not be set up, mounted or unmounted (the message says why)."""


def _fuse_unmount(mountpoint: Path, *, lazy: bool = False) -> None:
    """Unmount a FUSE mount with whichever tool this host has that succeeds (``lazy``:
    detach it even if busy or its process is gone; failures are ignored then)."""
    flag = "z" if lazy else ""
    for command in (["fusermount3", f"-u{flag}"], ["fusermount", f"-u{flag}"], ["umount"] + (["-l"] if lazy else [])):
        if shutil.which(command[0]) is None:
            continue
        if subprocess.run([*command, str(mountpoint)], capture_output=True).returncode == 0:
            return
    if not lazy:
        raise PeerError(f"could not unmount {mountpoint}")


def _s3_client(endpoint: S3Endpoint) -> Any:
    """A boto3 client straight to s3rver (not through the proxy: the benchmark's own
    requests are not part of any system's traffic)."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint.url, region_name="us-east-1",
                        aws_access_key_id=endpoint.key, aws_secret_access_key=endpoint.secret)


# ------------------------------------------------------------------ systems
class System(abc.ABC):
    """One system under test: its bucket, mount point and process."""

    name = ""
    cache_emptying = ""  # how mount_cold empties its caches (for the report)

    def __init__(self, directory: Path, endpoint: S3Endpoint, proxy_url: str, size_bytes: int) -> None:
        self.directory = directory / self.name
        self.directory.mkdir(parents=True, exist_ok=True)
        self.mountpoint = self.directory / "mnt"
        self.mountpoint.mkdir(exist_ok=True)
        self.endpoint, self.proxy_url, self.size_bytes = endpoint, proxy_url, size_bytes
        self.bucket = self.name
        self.mounted = False
        self.page_cache_note: str | None = None  # why the page cache was not dropped
        self.cache_dir: Path | None = None  # a local cache that survives a remount
        self.drop_page_cache = True  # before each cold mount (the benchmark's --keep-page-cache: False)
        self.s3 = _s3_client(endpoint)

    # the time after a close until the system starts uploading (0: at close or sooner)
    settle_min_s = 0.0
    has_s3 = True  # False: the local-disk ceiling, which keeps everything on the disk
    small_files_only = False  # True: a floor that serves only the small-file step (peer_floor.py)

    def process_id(self) -> int | None:
        """The process serving the mount (its CPU is reported per small file), if any."""
        return None

    def is_mounted(self) -> bool:
        return self.mounted and os.path.ismount(self.mountpoint)

    def uploads_pending(self) -> bool:
        """Whether the system says it still has bytes to upload (False when it cannot
        tell: then only the proxy's quiet shows it is done)."""
        return False

    def path(self, name: str) -> Path:
        return self.mountpoint / name

    def create_bucket(self) -> None:
        self.endpoint.create_bucket(self.bucket)

    def prepare_cold_file(self, name: str, payload_file: Path) -> None:
        """Put ``payload_file``'s bytes where a cold read of ``name`` must fetch them from
        S3. Peers read plain objects: the object is uploaded straight to s3rver."""
        self.s3.upload_file(str(payload_file), self.bucket, name)

    def bytes_in_s3(self, name: str) -> int:
        """How many bytes of ``name`` S3 holds now (0 when there is no object)."""
        from botocore.exceptions import ClientError

        try:
            return int(self.s3.head_object(Bucket=self.bucket, Key=name)["ContentLength"])
        except ClientError:
            return 0

    def fsync_mechanism(self) -> str:
        return ""

    @abc.abstractmethod
    def mount(self) -> None:
        """Mount it (its process is ready when this returns)."""

    @abc.abstractmethod
    def unmount(self) -> None:
        """Unmount it and wait for its process to exit."""

    @abc.abstractmethod
    def kill(self) -> None:
        """SIGKILL its process (a hung mount): calls blocked on the mount return with
        an error, and the mount point is detached. Safe from another thread."""

    def clear_cache(self) -> None:
        """Remove what the system keeps across mounts: its cache directory, if it has one."""
        if self.cache_dir is not None:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    def mount_cold(self) -> None:
        """Unmount if mounted, empty every cache, mount afresh."""
        if self.mounted:
            self.unmount()
        self.clear_cache()
        self.page_cache_note = drop_page_cache() if self.drop_page_cache else "--keep-page-cache"
        self.mount()


class ProcessSystem(System):
    """A peer mounted by a foreground process of its own (s3fs, rclone)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.directory / "mount.log"

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The foreground mount command."""

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def process_id(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def mount(self) -> None:
        with open(self.log_path, "ab") as sink:
            self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                            env=self.environment())
        try:
            wait_for_mount(self.mountpoint, self.process, timeout_s=MOUNT_TIMEOUT_S, describe=self.log_tail)
        except HarnessError as e:
            raise PeerError(f"{self.name} did not mount: {e}") from None
        self.mounted = True

    def unmount(self) -> None:
        self.mounted = False
        if self.process is None:
            return
        process, self.process = self.process, None
        try:
            if os.path.ismount(self.mountpoint):
                _fuse_unmount(self.mountpoint)
            process.wait(timeout=UNMOUNT_TIMEOUT_S)
        except (PeerError, subprocess.TimeoutExpired) as e:
            process.kill()
            process.wait()
            _fuse_unmount(self.mountpoint, lazy=True)
            raise PeerError(f"{self.name} did not unmount and exit within {UNMOUNT_TIMEOUT_S:g} s "
                            f"({e}); killed") from None


    def kill(self) -> None:
        self.mounted = False
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            process.wait()
        _fuse_unmount(self.mountpoint, lazy=True)


class S3fsSystem(ProcessSystem):
    name = "s3fs"
    cache_emptying = "new s3fs process (no use_cache: no local copy survives)"

    def command(self) -> list[str]:
        passwd = self.directory / "passwd"
        passwd.write_text(f"{self.endpoint.key}:{self.endpoint.secret}\n")
        passwd.chmod(0o600)
        options = ",".join([
            f"url={self.proxy_url}", "use_path_request_style", f"passwd_file={passwd}", "endpoint=us-east-1",
            "notsup_compat_dir", "enable_noobj_cache",
        ])
        return ["s3fs", self.bucket, str(self.mountpoint), "-f", "-o", options]

    def fsync_mechanism(self) -> str:
        return "in S3: each fsync uploads the whole file (one PUT of the object)"


class RcloneSystem(ProcessSystem):
    cache_mode = ""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.cache_dir = self.directory / "vfs-cache"
        self.config_path = self.directory / "rclone.conf"

    def command(self) -> list[str]:
        self.config_path.write_text(
            "[s3rver]\ntype = s3\nprovider = Other\n"
            f"access_key_id = {self.endpoint.key}\nsecret_access_key = {self.endpoint.secret}\n"
            f"endpoint = {self.proxy_url}\nregion = us-east-1\nforce_path_style = true\nlist_version = 1\nno_head = true\n"
        )
        return ["rclone", "mount", f"s3rver:{self.bucket}", str(self.mountpoint), "--config", str(self.config_path),
                "--vfs-cache-mode", self.cache_mode, "--cache-dir", str(self.cache_dir)]

    def environment(self) -> dict[str, str]:
        """This environment without ``AWS_*`` and ``RCLONE_*`` variables: the config file
        says everything (and rclone 1.60 refuses to start its S3 client when
        ``AWS_CA_BUNDLE`` is set, though the endpoint here is plain HTTP)."""
        return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}


class RcloneOffSystem(RcloneSystem):
    name = "rclone-off"
    cache_mode = "off"
    cache_emptying = "new rclone process, --vfs-cache-mode off (no file cache)"

    def fsync_mechanism(self) -> str:
        return "nothing: no fsync/fdatasync of any local file, and the object reaches S3 at close"


class RcloneFullSystem(RcloneSystem):
    name = "rclone-full"
    cache_mode = "full"
    cache_emptying = "new rclone process, its --cache-dir removed"
    settle_min_s = RCLONE_WRITE_BACK_S

    def fsync_mechanism(self) -> str:
        return (f"nothing: the bytes sit in the local VFS cache file, not fsynced; the upload starts "
                f"{RCLONE_WRITE_BACK_S:g} s after close")


class TierfsSystem(System):
    name = "tierfs"
    cache_emptying = "daemon restarted (its block cache is in its memory)"

    def __init__(self, *args: Any, durability: str = "pd") -> None:
        super().__init__(*args)
        self.durability = durability
        self.data_dir = self.directory / "data"
        self.config_path = self.directory / "tierfs.toml"
        self.config_path.write_text(
            f'tier2_url = "s3://{self.bucket}/chunks"\n'
            f'tier2_endpoint_url = "{self.proxy_url}"\n'
            f'durability = "{durability}"\n'
            f"block_cache_bytes = {warm_cache_bytes(self.size_bytes)}\n"
        )
        self.handle: Mount | None = None

    def mount(self) -> None:
        env = {"AWS_ACCESS_KEY_ID": self.endpoint.key, "AWS_SECRET_ACCESS_KEY": self.endpoint.secret,
               "AWS_DEFAULT_REGION": "us-east-1"}
        try:
            self.handle = Mount(self.data_dir, self.mountpoint, config_file=self.config_path, env=env,
                                drop_tierfs_env=True, log_path=self.directory / "mount.log", verbose=False,
                                timeout_s=MOUNT_TIMEOUT_S)
        except HarnessError as e:
            raise PeerError(f"tierfs did not mount: {e}") from None
        self.mounted = True

    def process_id(self) -> int | None:
        return self.handle.pid if self.handle is not None else None

    def unmount(self) -> None:
        self.mounted = False
        if self.handle is None:
            return
        handle, self.handle = self.handle, None
        code, stderr = handle.unmount(timeout_s=UNMOUNT_TIMEOUT_S)
        if code != 0:
            raise PeerError(f"the tierfs mount exited with {code}: {stderr[-2000:]}")

    def kill(self) -> None:
        self.mounted = False
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.kill9()
        _fuse_unmount(self.mountpoint, lazy=True)

    def prepare_cold_file(self, name: str, payload_file: Path) -> None:
        """tierfs reads its own segment: appended through the daemon's API and flushed,
        so its chunks are S3 objects before the cold mount."""
        if self.handle is None:
            raise PeerError("tierfs is not mounted")
        client = self.handle.client()
        try:
            client.create(name)
            offset = 0
            with open(payload_file, "rb") as source:
                while piece := source.read(TIERFS_SEGMENT_PIECE_BYTES):
                    client.append(name, piece, offset)
                    offset += len(piece)
            client.op("flush", path=name)
            flushed = sum(c["end"] - c["start"] for c in client.layout(name))
        finally:
            client.close()
        if flushed != offset:
            raise PeerError(f"{name}: {flushed} of {offset} bytes flushed to S3")

    def bytes_in_s3(self, name: str) -> int:
        return int(os.getxattr(self.path(name), "user.tierfs.flushed_length"))

    def uploads_pending(self) -> bool:
        return self.handle is not None and self.handle.metrics()["tierfs_flush_backlog_bytes"] > 0

    def fsync_mechanism(self) -> str:
        if self.durability == "tier2":
            return "in S3: each append waits until it is flushed to S3 (durability tier2)"
        if self.durability == "vd":
            return ("on the local disk: fsync runs a journal fdatasync (durability vd: appends are acknowledged "
                    "after write(2)); S3 later (storage writer)")
        return ("on the local disk: each append waits for a journal fdatasync (durability pd), fsync adds "
                "none; S3 later (storage writer)")


class LocalDiskSystem(System):
    """The ceiling: the same operations on a directory of the scratch disk (ext4 or
    whatever ``--dir`` is on), no FUSE, no S3. Not a peer: never the "best peer"."""

    name = "local-disk"
    cache_emptying = "nothing of its own (the page cache, below)"
    has_s3 = False

    def create_bucket(self) -> None:
        """No bucket: nothing goes to S3."""

    def mount(self) -> None:
        self.mounted = True

    def unmount(self) -> None:
        self.mounted = False

    def kill(self) -> None:
        self.mounted = False

    def is_mounted(self) -> bool:
        return self.mounted

    def prepare_cold_file(self, name: str, payload_file: Path) -> None:
        shutil.copyfile(payload_file, self.path(name))
        with open(self.path(name), "rb+") as copy:
            os.fsync(copy.fileno())

    def bytes_in_s3(self, name: str) -> int:
        return 0

    def fsync_mechanism(self) -> str:
        return "on the local disk: fsync of the file (no S3)"


SYSTEMS: dict[str, type[System]] = {
    cls.name: cls for cls in (TierfsSystem, S3fsSystem, RcloneOffSystem, RcloneFullSystem, LocalDiskSystem)
}
CEILING = LocalDiskSystem.name
PROGRAM_OF = {"s3fs": "s3fs", "rclone-off": "rclone", "rclone-full": "rclone"}
