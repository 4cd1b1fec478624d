"""Several real cluster daemons on one machine, as several hosts: each with its own data
dir and TCP port, all on one PostgreSQL database and one tier-2 (test support, also used
by the cluster benchmark); ``make_certificates`` makes a CA and a host certificate for
a cluster (and a PostgreSQL) over TLS.

Invariant: ``wait_balanced`` returns only once every container has a live owner and
the owners hold the balanced share each, as the lease table says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg

from tierfs.cluster.container_map import container_of
from tierfs.remote.client import TierClient
from tierfs.testing.harness import Daemon, HarnessError, Mount, start_daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tcp_connections_to(pid: int, port: int) -> int:
    """How many TCP connections process ``pid`` has open to ``port`` (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[9] in inodes and fields[3] == "01":  # ESTABLISHED
                count += 1
    return count


@dataclasses.dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA certificate (PEM) that signed ``cert``
    cert: Path  # the host certificate (PEM)
    key: Path  # its private key (PEM, mode 0600)

    def config_lines(self) -> list[str]:
        return [f'tls_cert_path = "{self.cert}"', f'tls_key_path = "{self.key}"', f'tls_ca_path = "{self.ca}"']


def make_certificates(directory: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost"),
                      days: int = 2) -> Certificates:
    """A fresh CA and a certificate it signed for ``hosts`` (IP addresses or names), in
    ``directory``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def alt_name(host: str) -> x509.GeneralName:
        try:
            return x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            return x509.DNSName(host)

    now = datetime.datetime.now(datetime.UTC)
    ca_key, host_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("tierfs test CA")).issuer_name(name("tierfs test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    host = (x509.CertificateBuilder().subject_name(name(hosts[0])).issuer_name(ca.subject)
            .public_key(host_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([alt_name(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    made = Certificates(directory / "ca.pem", directory / "host.pem", directory / "host.key")
    made.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    made.cert.write_bytes(host.public_bytes(serialization.Encoding.PEM))
    made.key.touch(mode=0o600)
    made.key.write_bytes(host_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    return made


class Cluster:
    """``start(i)`` runs daemon ``i`` (data dir ``<root>/host-<i>``) on a fresh port;
    with ``tls``, every daemon serves its TCP ports over TLS and trusts its CA."""

    def __init__(self, root: Path, metadata_url: str, tier2_url: str, *, containers: int = 6,
                 lease_s: float = 2.0, flush_interval_s: float = 0.2, extra: Sequence[str] = (),
                 tls: Certificates | None = None) -> None:
        extra = [*extra, *(tls.config_lines() if tls is not None else [])]
        self.root = root
        self.metadata_url = metadata_url
        self.containers = containers
        self.config = root / "cluster.toml"
        root.mkdir(parents=True, exist_ok=True)
        self.config.write_text("\n".join([
            f'tier2_url = "{tier2_url}"', f'metadata_url = "{metadata_url}"',
            f"containers = {containers}", f"lease_s = {lease_s}",
            f"flush_interval_s = {flush_interval_s}", "owner_check_interval_s = 0.2", *extra]) + "\n")
        self.daemons: dict[int, Daemon | Mount] = {}
        self.ports: dict[int, int] = {}
        self.starts = 0

    def start_together(self, indexes: Sequence[int]) -> None:
        """``start`` each of ``indexes`` at once: each takes its share of the containers
        as it joins, none opens them all first."""
        failures: list[BaseException] = []

        def start(index: int) -> None:
            try:
                self.start(index)
            except BaseException as e:  # noqa: BLE001 - raised below, in the caller
                failures.append(e)

        threads = [threading.Thread(target=start, args=(index,)) for index in indexes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]

    @contextlib.contextmanager
    def connection_peaks(self, port: int) -> Iterator[dict[int, int]]:
        """The most TCP connections to ``port`` (the database's) each daemon held while
        the block ran, sampled from /proc every 20 ms: daemon index -> connections."""
        peaks: dict[int, int] = {}
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                for index, daemon in list(self.daemons.items()):
                    try:
                        peaks[index] = max(peaks.get(index, 0), tcp_connections_to(daemon.proc.pid, port))
                    except OSError:
                        pass  # starting or gone
                done.wait(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            yield peaks
        finally:
            done.set()
            watcher.join()

    def write_in_every_container(self, indexes: Sequence[int]) -> dict[str, bytes]:
        """Every daemon of ``indexes`` at once creates ``<top>/from-<index>`` in a
        top-level directory of every container and appends its name: the contents."""
        tops: dict[int, str] = {}
        for number in range(self.containers * 20):
            tops.setdefault(container_of(f"d{number}", self.containers), f"d{number}")
        assert len(tops) == self.containers, "no top-level name found for some container"
        expected = {f"{top}/from-{index}": f"{top}/from-{index}\n".encode() for top in tops.values() for index in indexes}

        def write(index: int) -> None:
            client = self.client(index)
            try:
                for top in tops.values():
                    client.create(f"{top}/from-{index}", parents=True)
                    client.append(f"{top}/from-{index}", expected[f"{top}/from-{index}"])
            finally:
                client.close()

        writers = [threading.Thread(target=write, args=(index,)) for index in indexes]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        return expected

    def data_dir(self, index: int) -> Path:
        return self.root / f"host-{index}"

    def start(self, index: int, *, wait: bool = True) -> Daemon:
        port = self.ports.setdefault(index, free_port())
        self.starts += 1  # each start's log kept beside the data dirs, for whoever reads a failure
        daemon = start_daemon(self.data_dir(index), "--listen", f"127.0.0.1:{port}", config_file=self.config,
                              log_path=self.root / f"host-{index}.start-{self.starts}.log")
        self.daemons[index] = daemon
        return daemon

    def mount(self, index: int, mountpoint: Path, *args: str) -> Mount:
        """Daemon ``index`` serving a FUSE mount of the whole namespace at ``mountpoint``
        (``args``: more ``tierfs mount`` options)."""
        port = self.ports.setdefault(index, free_port())
        mounted = Mount(self.data_dir(index), mountpoint, "--listen", f"127.0.0.1:{port}", *args,
                        config_file=self.config)
        self.daemons[index] = mounted
        return mounted

    def client(self, index: int) -> TierClient:
        return self.daemons[index].client()

    def daemon_id(self, index: int) -> str:
        return (self.data_dir(index) / "daemon-id").read_text().strip()

    def owners(self) -> dict[int, str | None]:
        """container -> the daemon id holding a live lease on it (None: nobody)."""
        with psycopg.connect(self.metadata_url) as conn:
            rows = conn.execute("SELECT container, CASE WHEN expires_at > now() THEN owner END "
                                "FROM cluster_containers ORDER BY container").fetchall()
        return {int(c): owner for c, owner in rows}

    def held_by(self, index: int) -> list[int]:
        me = self.daemon_id(index)
        return [c for c, owner in self.owners().items() if owner == me]

    def wait_balanced(self, indexes: Sequence[int], timeout_s: float = 60.0) -> dict[int, str | None]:
        ids = {self.daemon_id(i) for i in indexes}
        share = -(-self.containers // len(ids))
        deadline = time.monotonic() + timeout_s
        while True:
            owners = self.owners()
            counts = {daemon_id: list(owners.values()).count(daemon_id) for daemon_id in ids}
            if all(owner in ids for owner in owners.values()) and max(counts.values()) <= share:
                return owners
            if time.monotonic() > deadline:
                raise HarnessError(f"containers not balanced over {sorted(ids)} after {timeout_s} s: {owners}")
            time.sleep(0.1)

    def stop_all(self) -> None:
        """Every daemon stopped (mounts unmounted), the daemons all at once: one by one,
        the others would take each one's containers in turn, and each one's stop would
        wait for the others' connections to it."""
        daemons = [daemon for daemon in self.daemons.values() if not isinstance(daemon, Mount)]
        for daemon in daemons:
            daemon.terminate()
        for mounted in self.daemons.values():
            if isinstance(mounted, Mount):
                mounted.unmount()
        for daemon in daemons:
            daemon.wait()
