"""The tierfs daemon: one process owns a data dir and serves it over HTTP.

``serve(config)`` opens the store, serves the API on ``<data_dir>/tierfs.sock``
(owner-only: the socket is chmod 0600 inside a 0700 data dir), its segment reads for
streamed follows on ``<data_dir>/tierfs-follow.sock`` (``stream_socket``: a lean server
of one GET per connection), its pipelined appends on ``<data_dir>/tierfs-append.sock``
(``append_socket``) and, when asked, the API on a TCP address that requires a
bearer token, until SIGTERM/SIGINT (or ``stop``); then it stops accepting requests,
ends the streamed follows, flushes and closes the store (see ``open_store``), and
removes the sockets. The listen backlog (``LISTEN_BACKLOG``) and the open file limit
are sized for thousands of connections (followers each hold one).

Invariants:
- The API socket is served last: once it answers (what clients and ``tierfs serve``'s
  callers wait for), the token, the TCP listener, the follow and append sockets exist.
- Only the lock holder creates the socket, so an existing socket file found at start is
  stale (its daemon died) and is replaced.
- A cluster daemon's TCP append listener is bound before the daemon registers, so the
  address other daemons read from the registry accepts connections (they queue until it
  serves); it takes only requests from registered daemons (``server/credentials``).
- The TCP token is generated once (``secrets.token_urlsafe``), stored owner-only in
  ``<data_dir>/token``, and never logged.
- With a certificate (``tls_cert_path``), both TCP listeners speak TLS only, and the
  URLs registered for the others are ``https://`` and ``tls://``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import resource
import signal
import socket
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import hypercorn.config
import hypercorn.trio
import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.datadir import (
    TOKEN_NAME,
    append_socket_path,
    follow_socket_path,
    load_or_create_token,
    socket_path,
)
from tierfs.contracts.errors import InvalidArgumentError
from tierfs.server.append_socket import serve_append_listener, serve_append_socket
from tierfs.server.credentials import PeerCheck, TcpCredentials
from tierfs.server.follow_stream import FollowStreams
from tierfs.server.http_api import BearerTokenAuth, WholeRequestRead, api_routes
from tierfs.server.listeners import server_context
from tierfs.server.reads import ReadRoutes
from tierfs.server.stream_socket import serve_stream_socket
from tierfs.store.facade import open_store
from tierfs.store.served import ServedStore

log = logging.getLogger(__name__)

# Connections waiting to be accepted. hypercorn's default (100) overflowed when a few
# hundred followers connected at once: a Unix socket's connect then fails with EAGAIN.
# The kernel caps it at net.core.somaxconn (4096 since Linux 5.4).
LISTEN_BACKLOG = 4096
# Every follower holds a connection (a descriptor) for as long as it follows: the soft
# limit (often 1024) is raised towards the hard one, up to this.
WANTED_DESCRIPTORS = 65536


def _hypercorn_config(bind: str, cert_path: str = "", key_path: str = "") -> hypercorn.config.Config:
    config = hypercorn.config.Config()
    config.bind = [bind]
    if cert_path:  # TLS on the TCP API (the config checked that both are given)
        config.certfile, config.keyfile = cert_path, key_path
    config.backlog = LISTEN_BACKLOG
    config.accesslog = None  # request lines may carry names; headers carry tokens
    config.errorlog = logging.getLogger("tierfs.http")
    config.keep_alive_timeout = 75.0  # clients reuse connections across long polls
    # hypercorn closes a keep-alive connection after 1,000 requests by default; an
    # appender would reconnect every 1,000 appends for nothing.
    config.keep_alive_max_requests = 1 << 30
    return config


# A service run beside the API on the same store and event loop (the FUSE mount):
# started with ``nursery.start(service, store, stopping)``; it reports started once it
# serves, returns soon after ``stopping`` is set, and sets ``stopping`` itself when it
# ends on its own (the mount was unmounted), which stops the daemon.
Service = Callable[..., Awaitable[None]]


async def serve(
    config: StoreConfig,
    *,
    listen: str | None = None,
    stop: trio.Event | None = None,
    service: Service | None = None,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGTERM/SIGINT (or ``stop`` is set, or ``service`` ends)."""
    async with _open_served(config, listen) as (store, append_listener, peers):
        data_dir = config.data_dir
        os.chmod(data_dir, 0o700)
        sock, follow_sock = socket_path(data_dir), follow_socket_path(data_dir)
        append_sock = append_socket_path(data_dir)
        sock.unlink(missing_ok=True)
        _raise_descriptor_limit()
        streams = FollowStreams(store)
        routes = api_routes(store, streams)
        app = WholeRequestRead(routes)  # build_app's, sharing its routes with the TCP listener
        reads = ReadRoutes(store, streams)  # the follow socket's route
        shutdown = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(streams.run)
                credentials = TcpCredentials(load_or_create_token(data_dir), peers) if listen else None
                if credentials is not None and listen:
                    authed = WholeRequestRead(BearerTokenAuth(routes, credentials))
                    tcp = _hypercorn_config(listen, config.tls_cert_path, config.tls_key_path)
                    await nursery.start(_serve_one, authed, tcp, shutdown)
                if append_listener is not None and credentials is not None:
                    tls = server_context(config.tls_cert_path, config.tls_key_path) if config.tls_cert_path else None
                    await nursery.start(serve_append_listener, store, append_listener, shutdown, credentials, tls)
                await nursery.start(serve_stream_socket, reads, follow_sock, LISTEN_BACKLOG, shutdown)
                await nursery.start(serve_append_socket, store, append_sock, LISTEN_BACKLOG, shutdown)
                # last: once the API socket answers, everything above is there
                await nursery.start(_serve_one, app, _hypercorn_config(f"unix:{sock}"), shutdown)
                os.chmod(sock, 0o600)
                log.info("serving %s on %s (epoch %d)", data_dir, sock, store.epoch)
                if listen:
                    log.info("also serving on tcp %s%s (bearer token in %s)", listen,
                             " over TLS" if config.tls_cert_path else "", data_dir / TOKEN_NAME)
                stopping = trio.Event()
                if service is not None:
                    await nursery.start(service, store, stopping)
                # Everything loaded so far (modules, the namespace) lives as long as the
                # daemon: kept out of the collector's full passes, which otherwise took
                # 25-90 ms each under load (pauses every request and stream waits out).
                # The collector's thresholds were set as the command started
                # (tierfs.cli.parser.GC_THRESHOLDS).
                gc.collect()
                gc.freeze()
                task_status.started(sock)
                async with trio.open_nursery() as watchers:
                    watchers.start_soon(_wait_for_stop, stop, stopping)
                    await stopping.wait()
                    watchers.cancel_scope.cancel()
                log.info("shutting down: flushing and closing %s", data_dir)
                streams.stop()
                shutdown.set()
        finally:
            sock.unlink(missing_ok=True)
            follow_sock.unlink(missing_ok=True)
            append_sock.unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def _open_served(config: StoreConfig, listen: str | None,
                       ) -> AsyncIterator[tuple[ServedStore, trio.socket.SocketType | None, PeerCheck | None]]:
    """The data dir's store, or in cluster mode (``containers``) the whole namespace
    through the containers this daemon holds and the owners of the others, with the
    TCP append listener the others forward appends to (bound here, so its address is
    registered with the daemon) and the check of the other daemons' credentials."""
    if not config.containers:
        async with open_store(config, interruptible=True) as store:
            yield store, None, None
        return
    if not listen:
        raise InvalidArgumentError(
            "a cluster daemon (containers > 0) needs --listen HOST:PORT: the other daemons "
            "forward writes and tails of its containers there")
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = load_or_create_token(config.data_dir)
    # here, not at the top: a one-host daemon loads no cluster part (nor its HTTP client)
    from tierfs.cluster.opening import open_cluster

    secure = bool(config.tls_cert_path)
    scheme = "https" if secure else "http"
    if config.cluster_url and not config.cluster_url.startswith(f"{scheme}://"):
        raise InvalidArgumentError(
            f"cluster_url {config.cluster_url!r} must be {scheme}:// since this daemon serves "
            + ("TLS (tls_cert_path)" if secure else "plain HTTP (no tls_cert_path)"))
    url = config.cluster_url or f"{scheme}://{listen}"
    listener = await _append_listener(listen, config.cluster_append_port)
    try:
        port = listener.getsockname()[1]
        append_url = f"{'tls' if secure else 'tcp'}://{_url_host(url)}:{port}"
        async with open_cluster(config, url, token, append_url) as cluster:
            yield cluster, listener, cluster.peers.verify
    finally:
        listener.close()


async def _append_listener(listen: str, port: int) -> trio.socket.SocketType:
    """A TCP socket listening on ``listen``'s host and ``port`` (0: the system's choice)."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    family, kind, proto, _, address = (await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))[0]
    sock = trio.socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _url_host(url: str) -> str:
    """The host of ``url`` as a URL writes it (an IPv6 address in brackets)."""
    host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _raise_descriptor_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = WANTED_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, WANTED_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        log.info("open file limit raised from %d to %d (one descriptor per connection)", soft, wanted)


async def _serve_one(
    app: object, config: hypercorn.config.Config, shutdown: trio.Event,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    await hypercorn.trio.serve(
        app, config, shutdown_trigger=shutdown.wait, task_status=task_status  # type: ignore[arg-type]
    )


async def _wait_for_stop(stop: trio.Event | None, stopping: trio.Event) -> None:
    """Set ``stopping`` when ``stop`` is set or, without one, on SIGTERM/SIGINT."""
    if stop is not None:
        await stop.wait()
    else:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                break
    stopping.set()
