"""The systems ``benchmarks peers`` compares, each mounted on the same s3rver through the
counting proxy, each with its own bucket: tierfs (``tier2_url = s3://tierfs/chunks``,
flushed bytes only in S3, durability pd, a block cache holding the cold file, default
FUSE options; cold: the daemon restarted); s3fs (path-style, ``notsup_compat_dir,
enable_noobj_cache``: without them it lists the directory on every create; no
``use_cache``); rclone ``--vfs-cache-mode off`` and ``full`` (its cache in the scratch
directory; ListObjects v1: s3rver 3.7.1 answers a paginated ListObjectsV2 with 500;
``no_head``: s3rver answers a PUT before the object's file is written, so rclone's HEAD
right after an upload sometimes gets 404 and fails the close); the ceiling ``local-disk``
and the floors of ``harness.minimal_fs``, never peers. Missing peers are installed with
``apt-get install -y`` (as root only; else that error is every cell).

Invariants: ``mount_cold`` leaves no cache of the system's own (a new process, an empty
cache directory) and drops the kernel page cache when this process may (else says why);
every process started here is stopped by ``unmount`` or killed, none outlives the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from benchmarks import child_command, child_environment
from benchmarks.harness.figures import MiB
from benchmarks.harness.mounts import BenchError, MountProcess, fuse_unmount, s3_tier2, start_mount
from benchmarks.harness.s3 import S3Endpoint
from benchmarks.harness.scenario import say
from benchmarks.harness.stores import warm_cache_bytes, write_via_client
from tierfs.testing.harness import HarnessError

PEER_PACKAGES = {"s3fs": "s3fs", "rclone": "rclone"}  # program -> Debian package
RCLONE_WRITE_BACK_S = 5.0  # rclone's default --vfs-write-back: uploads start this long after close
FLOOR, PD_FLOOR, CEILING = "pyfuse3-floor", "pyfuse3-pd-floor", "local-disk"


class System:
    """One system under test: its bucket, mount point and process."""

    name = ""
    cache_emptying = ""  # how mount_cold empties its caches (for the report)
    fsync_mechanism = ""  # what an fsync does (for the report)
    program = ""  # the Debian-packaged program it needs, if any
    settle_min_s = 0.0  # the time after a close until it starts uploading
    has_s3 = True
    small_files_only = False  # a floor: the small-file step only
    cache_dir: Path | None = None

    def __init__(self, directory: Path, endpoint: S3Endpoint, proxy_url: str, size_bytes: int) -> None:
        self.directory, self.bucket = directory / self.name, self.name
        self.mountpoint = self.directory / "mnt"
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.endpoint, self.proxy_url, self.size_bytes = endpoint, proxy_url, size_bytes
        self.handle: Any = None  # the mount's process (MountProcess, or tierfs's Mount)
        self.drop_page_cache = True
        self.page_cache_note: str | None = None  # why the page cache was not dropped
        self.s3 = endpoint.client()  # straight to s3rver: the benchmark's requests are no system's traffic

    def command(self) -> list[str]:
        """The FUSE program's command line, for the systems ``mount`` starts as a
        ``MountProcess``; the ones that mount otherwise (tierfs, the local disk)
        override ``mount`` and never call this."""
        raise NotImplementedError(f"{type(self).__name__} mounts without a command line")

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def mount(self) -> None:
        self.handle = MountProcess(self.command(), self.mountpoint, self.directory / "mount.log", self.environment())

    def unmount(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.unmount()

    def kill(self) -> None:
        """SIGKILL its process (a hung mount); safe from another thread."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.kill()

    def is_mounted(self) -> bool:
        return self.handle is not None and os.path.ismount(self.mountpoint)

    def process_id(self) -> int | None:
        return getattr(self.handle, "pid", None)

    def path(self, name: str) -> Path:
        return self.mountpoint / name

    def uploads_pending(self) -> bool:
        """Whether it says it still has bytes to upload (False: it cannot tell)."""
        return False

    def create_bucket(self) -> None:
        self.endpoint.create_bucket(self.bucket)

    def prepare_cold_file(self, name: str, payload_file: Path) -> None:
        """Peers read plain objects: uploaded straight to s3rver."""
        self.s3.upload_file(str(payload_file), self.bucket, name)

    def bytes_in_s3(self, name: str) -> int:
        from botocore.exceptions import ClientError

        try:
            return int(self.s3.head_object(Bucket=self.bucket, Key=name)["ContentLength"])
        except ClientError:
            return 0

    def mount_cold(self) -> None:
        """Unmount if mounted, empty every cache, mount afresh."""
        self.unmount()
        if self.cache_dir is not None:
            shutil.rmtree(self.cache_dir, ignore_errors=True)
        self.page_cache_note = drop_page_cache() if self.drop_page_cache else "--keep-page-cache"
        self.mount()


class S3fsSystem(System):
    name, program = "s3fs", "s3fs"
    cache_emptying = "new s3fs process (no use_cache: no local copy survives)"
    fsync_mechanism = "in S3: each fsync uploads the whole file (one PUT of the object)"

    def command(self) -> list[str]:
        passwd = self.directory / "passwd"
        passwd.write_text(f"{self.endpoint.key}:{self.endpoint.secret}\n")
        passwd.chmod(0o600)
        options = f"url={self.proxy_url},use_path_request_style,passwd_file={passwd},endpoint=us-east-1," \
                  "notsup_compat_dir,enable_noobj_cache"
        return ["s3fs", self.bucket, str(self.mountpoint), "-f", "-o", options]


class RcloneOffSystem(System):
    name, program, cache_mode = "rclone-off", "rclone", "off"
    cache_emptying = "new rclone process, --vfs-cache-mode off (no file cache)"
    fsync_mechanism = "nothing: no fsync/fdatasync of any local file, and the object reaches S3 at close"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.cache_dir = self.directory / "vfs-cache"

    def environment(self) -> dict[str, str]:
        """No ``AWS_*`` or ``RCLONE_*``: the config file says everything (and rclone 1.60
        refuses to start its S3 client when ``AWS_CA_BUNDLE`` is set, even for plain HTTP)."""
        return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}

    def command(self) -> list[str]:
        config = self.directory / "rclone.conf"
        config.write_text(f"[s3rver]\ntype = s3\nprovider = Other\naccess_key_id = {self.endpoint.key}\n"
                          f"secret_access_key = {self.endpoint.secret}\nendpoint = {self.proxy_url}\nregion = us-east-1\n"
                          "force_path_style = true\nlist_version = 1\nno_head = true\n")
        return ["rclone", "mount", f"s3rver:{self.bucket}", str(self.mountpoint), "--config", str(config),
                "--vfs-cache-mode", self.cache_mode, "--cache-dir", str(self.cache_dir)]


class RcloneFullSystem(RcloneOffSystem):
    name, cache_mode, settle_min_s = "rclone-full", "full", RCLONE_WRITE_BACK_S
    cache_emptying = "new rclone process, its --cache-dir removed"
    fsync_mechanism = (f"nothing: the bytes sit in the local VFS cache file, not fsynced; the upload starts "
                       f"{RCLONE_WRITE_BACK_S:g} s after close")


class TierfsSystem(System):
    name = "tierfs"
    cache_emptying = "daemon restarted (its block cache is in its memory)"
    fsync_mechanism = ("on the local disk: each append waits for a journal fdatasync (durability pd), fsync adds "
                       "none; S3 later (storage writer)")

    def mount(self) -> None:
        config = s3_tier2(self.proxy_url, self.bucket, durability="pd",
                          block_cache_bytes=warm_cache_bytes(self.size_bytes))
        try:
            self.handle = start_mount(self.directory / "data", self.mountpoint, config=config,
                                      env=self.endpoint.environment())
        except HarnessError as e:
            raise BenchError(f"tierfs did not mount: {e}") from None

    def unmount(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None and (code := handle.unmount())[0] != 0:
            raise BenchError(f"the tierfs mount exited with {code[0]}: {code[1][-2000:]}")

    def kill(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.kill9()
        fuse_unmount(self.mountpoint, lazy=True)

    def prepare_cold_file(self, name: str, payload_file: Path) -> None:
        """tierfs reads its own segment: appended through the daemon's API and flushed."""
        client = self.handle.client()
        try:
            write_via_client(client, name, payload_file.read_bytes(), 4 * MiB)
        finally:
            client.close()

    def bytes_in_s3(self, name: str) -> int:
        return int(os.getxattr(self.path(name), "user.tierfs.flushed_length"))

    def uploads_pending(self) -> bool:
        return self.handle is not None and self.handle.metrics()["tierfs_flush_backlog_bytes"] > 0


class LocalDiskSystem(System):
    """The ceiling: the same operations on a directory of the scratch disk, no FUSE, no S3."""

    name, has_s3 = CEILING, False
    cache_emptying = "nothing of its own (the page cache, below)"
    fsync_mechanism = "on the local disk: fsync of the file (no S3)"

    def create_bucket(self) -> None:
        """Nothing goes to S3."""

    def mount(self) -> None:
        self.handle = self  # no process: ``process_id`` is None

    def unmount(self) -> None:
        self.handle = None

    kill = unmount

    def is_mounted(self) -> bool:
        return self.handle is not None

    def prepare_cold_file(self, name: str, payload_file: Path) -> None:
        shutil.copyfile(payload_file, self.path(name))
        with open(self.path(name), "rb+") as copy:
            os.fsync(copy.fileno())

    def bytes_in_s3(self, name: str) -> int:
        return 0


class FloorSystem(System):
    """``pyfuse3-floor``: the minimal filesystem creating small files in memory."""

    name, small_files_only, has_s3 = FLOOR, True, False
    cache_emptying, fsync_mechanism = "new process (everything it holds is in its memory)", "no S3"

    def command(self) -> list[str]:
        return child_command("benchmarks.harness.minimal_fs", str(self.mountpoint), "--direct-io")

    def environment(self) -> dict[str, str]:
        return child_environment()


class PdFloorSystem(FloorSystem):
    """``pyfuse3-pd-floor``: the floor plus the disk work of tierfs's pd promise per file."""

    name = PD_FLOOR

    def command(self) -> list[str]:
        return [*super().command(), "--pd-syncs", str(self.directory / "syncs")]


SYSTEMS: dict[str, type[System]] = {cls.name: cls for cls in (
    TierfsSystem, S3fsSystem, RcloneOffSystem, RcloneFullSystem, LocalDiskSystem, FloorSystem, PdFloorSystem)}


def install_peers(programs: set[str]) -> dict[str, str]:
    """``apt-get install`` the missing ``programs`` (as root): {program: why it is unavailable}."""
    missing = sorted(p for p in programs if shutil.which(p) is None)
    if missing and os.geteuid() != 0:
        return {p: f"{p} is not installed and installing it needs root (apt-get install {PEER_PACKAGES[p]})"
                for p in missing}
    if not missing:
        return {}
    say(f"set-up: apt-get install -y {' '.join(missing)} ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "--no-install-recommends", *(PEER_PACKAGES[p] for p in missing)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env, timeout=900)
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    failed = done.stderr.strip()[-500:] or done.stdout.strip()[-500:]
    return {p: f"apt-get install {PEER_PACKAGES[p]} failed: {failed}" for p in missing if shutil.which(p) is None}


def peer_versions() -> dict[str, str]:
    """The first line of each installed peer's version output."""
    versions = {}
    for program, args in (("s3fs", ["--version"]), ("rclone", ["version"])):
        if shutil.which(program):
            done = subprocess.run([program, *args], capture_output=True, text=True, timeout=30)
            versions[program] = ((done.stdout or done.stderr).strip().splitlines() or ["unknown"])[0]
    return versions


def drop_page_cache() -> str | None:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``: None if done, else why not."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        return f"cannot write /proc/sys/vm/drop_caches: {e.strerror}"
    return None
