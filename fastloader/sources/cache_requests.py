"""Forked readers ask the process that opened a node cache to fetch a shard for them.

Why: obstore cannot run in a forked process (remote.py), so a forked reader (a DataLoader worker)
sends the shard it misses, with its cache's token, over an authenticated Unix socket to the process
that opened the cache, which fetches it (one thread a reader) and answers; the reader then reads the
file itself. The answer carries what went wrong by kind, so that the reader raises the same error
the owner met (ContainerChanged, FileNotFoundError, StoreError), named.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from typing import Callable

from ..errors import StoreError
from ..locations import ContainerChanged
from . import remote


class Service:
    """In the process that owns the caches: fetches what forked readers ask for (a shard of an open
    cache, by its token, through `fetch(token, info)`), one thread a reader."""

    def __init__(self, fetch: Callable[[str, remote.ObjectInfo], None]):
        from multiprocessing.connection import Listener

        self.fetch = fetch
        self.owner, self.key = os.getpid(), os.urandom(16)
        self.listener = Listener(family="AF_UNIX", authkey=self.key)
        self.address = self.listener.address
        threading.Thread(target=self._accept, name="fastloader-node-cache", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection = self.listener.accept()
            except Exception:  # noqa: BLE001 - a client that failed authentication: the next one
                time.sleep(0.01)
                continue
            threading.Thread(target=self._serve, args=(connection,), name="fastloader-node-cache-reader",
                             daemon=True).start()

    def _serve(self, connection) -> None:
        with connection:
            while True:
                try:
                    token, fields = connection.recv()
                    info = remote.ObjectInfo(*fields)
                except (EOFError, OSError):
                    return
                try:
                    self.fetch(token, info)
                    answer = ("ok", "")
                except ContainerChanged as error:
                    answer = ("changed", str(error))
                except FileNotFoundError as error:
                    answer = ("missing", str(error.strerror))
                except Exception as error:  # noqa: BLE001 - the reader raises it, named
                    answer = ("store", str(error))
                try:
                    connection.send(answer)
                except OSError:
                    return


class Asker:
    """In a forked reader: its connection to the Service of the process it was forked from."""

    def __init__(self, service: Service):
        from multiprocessing.connection import Client

        self.owner = service.owner
        self.pid = os.getpid()
        self.connection = Client(service.address, family="AF_UNIX", authkey=service.key)

    def fetch(self, token: str, info: remote.ObjectInfo) -> None:
        try:
            self.connection.send((token, tuple(info)))
            kind, message = self.connection.recv()
        except (EOFError, OSError) as error:
            raise StoreError(f"{info.url}: the process that fetches shards for this one (pid {self.owner}) "
                             f"no longer answers ({error or type(error).__name__})") from None
        if kind == "changed":
            raise ContainerChanged(errno.ESTALE, message, info.url)
        if kind == "missing":
            raise FileNotFoundError(errno.ENOENT, message, info.url)
        if kind != "ok":
            raise StoreError(message)
