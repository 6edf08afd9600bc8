"""A real S3-compatible server for the tests: moto's server mode in a process of its own on
127.0.0.1, behind a small TCP proxy that the tests can slow down (latency per request), stop and
start again on the same port, as a store that goes away mid-epoch would.

Nothing here mocks a client: the code under test talks HTTP to a real server. The server keeps its
objects in memory, so stopping the proxy (not the server) is what "the store went away" means.
"""
from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ACCESS_KEY, SECRET_KEY, REGION = "testing", "testing", "us-east-1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Proxy:
    """TCP forwarding 127.0.0.1:port -> upstream, with an optional delay before each chunk a client
    sends (one request, for HTTP/1.1 without pipelining), and stop() / start() on the same port."""

    def __init__(self, upstream: tuple[str, int], port: int | None = None):
        self.upstream, self.port = upstream, port or free_port()
        self.latency = 0.0
        """Seconds added before each request is forwarded (a distant store)."""
        self.requests = 0
        self.sent = 0
        """Bytes the server sent back to clients (bodies and headers): what they fetched, by any client."""
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.start()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name="proxy-accept").start()

    def stop(self) -> None:
        """Refuse new connections and cut the open ones, as a store that went away."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True, name="proxy-pump").start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        pair = {client: server, server: client}
        try:
            while True:
                readable, _, _ = select.select(list(pair), [], [], 1.0)
                for sock in readable:
                    data = sock.recv(1 << 16)
                    if not data:
                        return
                    if sock is client:
                        self.requests += 1
                        if self.latency:
                            time.sleep(self.latency)
                    else:
                        with self._lock:
                            self.sent += len(data)
                    pair[sock].sendall(data)
        except (OSError, ValueError):  # a socket stop() closed under us
            return
        finally:
            with self._lock:
                self._sockets.difference_update(pair)
            for sock in pair:
                sock.close()


class ObjectStore:
    """The running server: its endpoint (through the proxy), the environment a client needs, and
    buckets and objects made straight on the server."""

    def __init__(self, process: subprocess.Popen, server_port: int):
        self.process = process
        self.proxy = Proxy(("127.0.0.1", server_port))
        self.server = f"http://127.0.0.1:{server_port}"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    def environment(self) -> dict[str, str]:
        """What a user sets for an S3-compatible endpoint over plain HTTP (AWS's standard names)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    @property
    def client(self):
        """boto3 (moto's own dependency) straight to the server: the tests' hands, not the code under test."""
        import boto3
        return boto3.client("s3", endpoint_url=self.server, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def make_bucket(self, name: str) -> str:
        with contextlib.suppress(self.client.exceptions.BucketAlreadyOwnedByYou):
            self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def upload(self, bucket: str, folder: Path, prefix: str = "") -> list[str]:
        """Every file under `folder` as `s3://bucket/prefix/relative/path`; their URLs, sorted."""
        urls = []
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            key = f"{prefix.strip('/')}/{path.relative_to(folder).as_posix()}".lstrip("/")
            self.put(bucket, key, path.read_bytes())
            urls.append(f"s3://{bucket}/{key}")
        return urls

    def delete(self, bucket: str, key: str) -> None:
        self.client.delete_object(Bucket=bucket, Key=key)


def start_server(environment: dict[str, str] | None = None) -> ObjectStore:
    """moto's S3 server on a free port, waited for until it answers; `environment`: more of the
    server's variables (INITIAL_NO_AUTH_ACTION_COUNT=0: it checks credentials and refuses unknown ones)."""
    executable = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if executable is None:
        pytest.skip("moto's server is not installed (pip install 'moto[server]', in the test extra)")
    port = free_port()
    process = subprocess.Popen([executable, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True,
                               env={**os.environ, **(environment or {})})
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).read()
            break
        except urllib.error.HTTPError:  # it answers, refusing an unsigned request
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto_server did not start on port {port} (exit {process.poll()})") from None
            time.sleep(0.1)
    return ObjectStore(process, port)


def stop_server(store: ObjectStore) -> None:
    store.proxy.stop()
    store.process.terminate()
    try:
        store.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        store.process.kill()


@pytest.fixture(scope="session")
def object_store_server():
    store = start_server()
    yield store
    stop_server(store)


@pytest.fixture
def object_store(object_store_server, monkeypatch):
    """The session's server with its environment set for this test, no latency, the proxy up."""
    store = object_store_server
    if store.proxy._listener is None:
        store.proxy.start()
    store.proxy.latency = 0.0
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    yield store
    store.proxy.latency = 0.0
    if store.proxy._listener is None:
        store.proxy.start()
