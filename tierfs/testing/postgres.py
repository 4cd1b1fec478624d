"""A real PostgreSQL server for tests, benchmarks and trials: Debian's ``postgresql``
package, ``initdb`` into a temporary directory, listening on 127.0.0.1 and on a Unix
socket in that directory.

    with PostgresServer() as server:
        url = server.create_database()      # postgresql://tierfs@127.0.0.1:PORT/NAME

``python -m tierfs.testing.postgres`` runs one in the foreground and prints its URL.

Invariants:
- PostgreSQL refuses to run as root; as root the server runs as the unprivileged
  system user ``tierfs-pg`` (created if missing), which owns only the temporary
  directory. Authentication is ``trust`` on loopback: a test server, never a product.
- ``stop()`` (and the context manager's exit, and interpreter exit) stops the server
  and removes its directory; no process is left behind.
- ``durable=False`` (tests) turns fsync off (commits survive a killed server, not a
  power loss); ``durable=True`` (benchmarks comparing
  with SQLite's synchronous=FULL) keeps PostgreSQL's durable defaults.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tierfs.testing.harness import processes

SERVER_USER = "tierfs-pg"
DATABASE_USER = "tierfs"


def _postgres_bin() -> Path:
    """The newest Debian PostgreSQL's bin directory, else the one on PATH."""
    def version(path: str) -> int:
        name = Path(path).parent.parent.name
        return int(name) if name.isdigit() else 0

    installed = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=version)
    if installed:
        return Path(installed[-1]).parent
    on_path = shutil.which("postgres")
    if on_path:
        return Path(on_path).resolve().parent
    raise RuntimeError("PostgreSQL is not installed: install Debian's `postgresql` package "
                       "(./dev.sh test does)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_user() -> tuple[int, int] | None:
    """(uid, gid) to run the server as, or None when not root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        SERVER_USER], check=True, capture_output=True)
        entry = pwd.getpwnam(SERVER_USER)
    return entry.pw_uid, entry.pw_gid


class PostgresServer:
    def __init__(self, durable: bool = False, port: int | None = None, directory: Path | None = None,
                 tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: a certificate and its key (PEM): the server then also takes TLS
        connections (``sslmode=verify-full`` with the CA that signed it)."""
        self.durable = durable
        self.tls = tls
        self.port = port or _free_port()
        self._given_directory = directory
        self.directory: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._bin = _postgres_bin()
        self._user = _server_user()

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        return f"postgresql://{DATABASE_USER}@127.0.0.1:{self.port}/{name}"

    @property
    def socket_directory(self) -> Path:
        assert self.directory is not None
        return self.directory

    def _run_as_server(self, args: list[str], cwd: Path) -> None:
        uid, gid = self._user if self._user is not None else (None, None)
        subprocess.run(args, check=True, capture_output=True, cwd=cwd, user=uid, group=gid)

    def start(self) -> PostgresServer:
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="tierfs-pg-")) if self._given_directory is None \
                else self._given_directory
            self.directory.mkdir(parents=True, exist_ok=True)
            if self._user is not None:
                os.chown(self.directory, *self._user)
            if not (self.directory / "data" / "PG_VERSION").exists():
                self._run_as_server([str(self._bin / "initdb"), "-D", str(self.directory / "data"),
                                     "-U", DATABASE_USER, "--auth=trust", "-E", "UTF8", "--no-sync",
                                     "--locale=C.UTF-8"], cwd=self.directory)
        # max_connections stays the stock 100: a cluster must fit what operators run
        options = ["-p", str(self.port), "-k", str(self.directory), "-c", "listen_addresses=127.0.0.1"]
        if not self.durable:
            # commits still reach the OS (a killed server keeps them), never the disk
            options += ["-c", "fsync=off", "-c", "full_page_writes=off"]
        if self.tls is not None:
            options += ["-c", "ssl=on", *self._server_tls_files()]
        log = open(self.directory / "server.log", "ab")  # noqa: SIM115 (the server keeps it)
        uid, gid = self._user if self._user is not None else (None, None)
        self._process = subprocess.Popen([str(self._bin / "postgres"), "-D", str(self.directory / "data"), *options],
                                         stdout=log, stderr=log, cwd=self.directory, start_new_session=True,
                                         user=uid, group=gid)
        log.close()
        atexit.register(self.stop)
        self._wait_ready()
        return self

    def _server_tls_files(self) -> list[str]:
        """The certificate and key copied where the server's user owns them (PostgreSQL
        refuses a key others can read)."""
        assert self.tls is not None and self.directory is not None
        options = []
        for source, name, setting in zip(self.tls, ("server.crt", "server.key"), ("ssl_cert_file", "ssl_key_file"), strict=True):
            target = self.directory / name
            target.write_bytes(source.read_bytes())
            os.chmod(target, 0o600)
            if self._user is not None:
                os.chown(target, *self._user)
            options += ["-c", f"{setting}={target}"]
        return options

    def _wait_ready(self, timeout_s: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"PostgreSQL exited at start-up:\n{self.log_tail()}")
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not answer within {timeout_s:.0f} s:\n"
                                       f"{self.log_tail()}") from None
                time.sleep(0.1)

    def log_tail(self, lines: int = 20) -> str:
        if self.directory is None or not (self.directory / "server.log").exists():
            return ""
        return "\n".join((self.directory / "server.log").read_text(errors="replace").splitlines()[-lines:])

    def create_database(self, name: str | None = None) -> str:
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.database_url(name)

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def kill(self) -> None:
        """SIGKILL the server (the metadata store disappears at once); ``start()`` brings
        it back on the same data."""
        if self._process is not None and self._process.poll() is None:
            # backends run in process groups of their own (PostgreSQL's setsid): each
            # would answer until it noticed the postmaster's death. Stopped first, the
            # postmaster forks no backend between the listing and the kill (one started
            # then, for a connection being opened, outlived the kill and hung its client)
            os.kill(self._process.pid, signal.SIGSTOP)
            children = [pid for pid, parent, _ in processes() if parent == self._process.pid]
            os.killpg(self._process.pid, signal.SIGKILL)
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            self._process.wait()
        self._process = None

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGINT)  # fast shutdown
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        self._process = None
        if self.directory is not None and self._given_directory is None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tierfs.testing.postgres",
                                     description="Run a throw-away PostgreSQL on 127.0.0.1 for trying tierfs.")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--dir", type=Path, default=None, help="keep the server's data here (reused if present)")
    parser.add_argument("--durable", action="store_true", help="keep fsync on")
    args = parser.parse_args(argv)
    stopped = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with PostgresServer(durable=args.durable, port=args.port, directory=args.dir) as server:
        print(server.url, flush=True)
        while not stopped:
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

