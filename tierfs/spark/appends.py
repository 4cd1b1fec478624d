"""How a Spark write task sends its bytes to its transaction segment: in order, from
one background thread (``PipelinedAppends``), so that the task encodes its next rows
while the daemon takes the previous append, and again after a pause when the daemon
refuses an append because its backlog is full (``append_when_there_is_room``); and the
worker's client of the daemon, kept for its next tasks (``task_client``).

Invariants:
- Appends reach the segment in the order they were given, each once when ``finish``
  returns: one thread sends them, one at a time; an append refused for a full backlog
  wrote nothing, so sending it again cannot duplicate bytes.
- Memory is bounded: at most ``APPENDS_WAITING`` appends wait besides the one being
  sent; ``send`` blocks while they are there.
- The first failure of an append is raised to the task (by the next ``send`` or by
  ``finish``); appends given after it are dropped, never sent.
- The thread never outlives the task: ``stop`` (in the task's ``finally``) drops what
  waits, ends a backlog pause at once, and returns when the thread has ended (after
  at most the append under way, bounded by the client's read timeout).
- The cached client is one per process (a forked worker makes its own: it never uses
  the sockets of its parent); ``TierClient`` may be shared between threads (httpx's
  ``Client`` is), and a task's thread and its sending thread never use it at once
  (the task waits in ``finish`` before its sync and seal).
"""

from __future__ import annotations

import os
import queue
import threading
import time

from tierfs.contracts.errors import BacklogFullError
from tierfs.contracts.writers import Writer, WriterSeq
from tierfs.remote.client import TierClient

APPENDS_WAITING = 2  # besides the one in flight: ~3 MiB per task with 1 MiB appends
# A task faster than the daemon's upload to tier-2 meets a full backlog: its append is
# refused and changed nothing, so it is sent again after a pause that doubles up to
# a second; after ten minutes of refusals the task fails (and Spark may retry it).
BACKLOG_RETRY_INITIAL_S = 0.05
BACKLOG_RETRY_MAX_S = 1.0
BACKLOG_WAIT_S = 600.0

_task_clients: dict[tuple[int, str, str | None], TierClient] = {}  # see task_client
_task_clients_lock = threading.Lock()


def task_client(url: str, token: str | None) -> TierClient:
    """This process's client of the daemon at ``url``, kept for the tasks it runs next
    (PySpark reuses its Python workers, and a kept client keeps its connections to the
    daemon, which a short task would otherwise open again). Keyed
    by process id too: a forked process never shares its parent's connections."""
    key = (os.getpid(), url, token)
    with _task_clients_lock:
        client = _task_clients.get(key)
        if client is None:
            client = _task_clients[key] = TierClient(url, token)
        return client


class _Stopped(Exception):
    """The task stopped its appends while one waited for room in the backlog."""


def append_when_there_is_room(client: TierClient, name: str, data: bytes,
                              stopping: threading.Event | None = None, writer: WriterSeq | None = None) -> None:
    """``client.append_on_socket`` (the append socket: far less of the daemon's CPU per
    byte than the HTTP API), sent again while the daemon refuses it for a full backlog
    (see ``BACKLOG_RETRY_*``); ``_Stopped`` if ``stopping`` is set during a pause."""
    delay_s, waited_s = BACKLOG_RETRY_INITIAL_S, 0.0
    while True:
        try:
            client.append_on_socket(name, data, writer)
            return
        except BacklogFullError:
            if waited_s >= BACKLOG_WAIT_S:
                raise
            if stopping is None:
                time.sleep(delay_s)
            elif stopping.wait(delay_s):
                raise _Stopped() from None
            waited_s += delay_s
            delay_s = min(2 * delay_s, BACKLOG_RETRY_MAX_S)


class PipelinedAppends:
    """Appends to the segment ``name`` (created VD on the first one) from a thread of
    their own; ``finish`` waits for the last and says whether the segment exists;
    ``stop`` ends the thread, dropping what has not been sent."""

    def __init__(self, client: TierClient, name: str) -> None:
        self._client = client
        self._name = name
        self._waiting: queue.Queue[bytes | None] = queue.Queue(maxsize=APPENDS_WAITING)
        self._error: BaseException | None = None
        self._stopping = threading.Event()
        self._writer = Writer()  # the task's appends to this segment, in order
        self.created = False
        self.sent_bytes = 0
        self._thread = threading.Thread(target=self._run, name=f"tierfs-append {name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._send_all()
        finally:
            self._client.close_append_connection()

    def _send_all(self) -> None:
        while (data := self._waiting.get()) is not None:
            if self._error is not None or self._stopping.is_set():
                continue  # drop what follows a failure or a stop; keep draining so send never blocks
            try:
                if not self.created:
                    self._client.create(self._name, durability="vd", parents=True)
                    self.created = True
                append_when_there_is_room(self._client, self._name, data, self._stopping, self._writer.next())
                self.sent_bytes += len(data)
            except _Stopped:
                pass
            except BaseException as e:  # raised in the task by send or finish
                self._error = e

    def send(self, data: bytes) -> None:
        """Give the next append (after the first failure's: raise it instead)."""
        self._raise_failure()
        self._waiting.put(data)

    def finish(self) -> bool:
        """Wait until every append given was sent; raise the first failure; whether
        the segment was created (False: nothing was ever given)."""
        if self._thread.is_alive():
            self._waiting.put(None)
            self._thread.join()
        self._raise_failure()
        return self.created

    def stop(self) -> None:
        """End the thread, dropping the appends not sent yet (idempotent; after
        ``finish`` there are none)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._waiting.put(None)  # the thread drops what waits, so there is room soon
            self._thread.join()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error
