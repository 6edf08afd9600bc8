"""The object store behind the byte seam: `s3://`, `gs://`, `az://` and `https://` through one client.

The client is obstore (Rust's object_store): one client for the four kinds of store, which reads each
store's standard environment variables (AWS_*, GOOGLE_*, AZURE_*), has timeouts and retries with
exponential backoff built in, and releases the GIL (its measurements against boto3 and s3fs:
docs/clusters.md#the-client). `dataset.remote.options` adds obstore's options for a config; they are
never logged.

What the rest of fastloader needs of a store, and nothing more: URLs expanded (brace ranges are
expanded before, by the shard patterns; globs here, by listing), an object's size and ETag, byte
ranges (the tar headers of the index), a whole object downloaded into a file (the node cache), and
errors that name the URL and the variable to set. Only this module and node_cache.py speak to the
store; the others read Locations (reading.py).

obstore's runtime does not survive a fork: a process forked after it made a request hangs on its
next one. So the store is used only by the process that made the client (and its threads); forked
readers (DataLoader workers) ask that process (node_cache.py), and `check_process` refuses the rest.

A `Client` is one dataset.remote's settings and the stores made with them: `client_for(settings)`
gives the same one for the same settings (and store environment) while something holds it (the node
cache a loader opened, which fetches with it; a listing under way), another for others, so two loaders
with different settings in one process each keep their own, and a client goes with the last loader
that held it.
"""
from __future__ import annotations

import fnmatch
import glob as local_glob
import logging
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable, Iterator, Mapping, NamedTuple, Sequence

from ..errors import ConfigError, StoreError
from .urls import is_url

log = logging.getLogger("fastloader")

PART_BYTES = 16 << 20
"""A whole object is downloaded in ranged requests of this many bytes: each its own timeout and retries."""
LISTED_FROM = 4
"""URLs of one folder from which one listing, rather than a HEAD request each, says their sizes and ETags."""
STAT_THREADS = 32
"""Requests in flight while a split's objects are listed or their headers read."""

_VARIABLES = {
    "s3": ("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN for temporary ones)",
           "AWS_ENDPOINT_URL for an S3-compatible store (with AWS_ALLOW_HTTP=true for an http:// one), AWS_REGION"),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS (the path of a service account's JSON key)", "GOOGLE_BASE_URL"),
    "az": ("AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_TOKEN)",
           "AZURE_STORAGE_ENDPOINT"),
    "https": ("nothing: an https:// URL is read without credentials (a presigned URL carries its own)", ""),
}
"""Per kind of store: the variables that give credentials, and those that say where the store is."""


def credentials_words(url: str) -> str:
    """The variables that give a URL's store credentials and say where it is, for a message."""
    credentials, where = _VARIABLES[kind(url)]
    return f"{credentials}; {where}" if where else credentials


def kind(url: str) -> str:
    """s3, gs, az or https: which store's environment a URL reads."""
    scheme = url.split("://", 1)[0]
    return {"s3a": "s3", "abfs": "az", "abfss": "az", "azure": "az", "adl": "az", "http": "https"}.get(scheme, scheme)


@dataclass(frozen=True)
class Settings:
    """dataset.remote's client keys (schema.RemoteConfig)."""
    options: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    timeout: float = 60.0
    retries: int = 10
    retry_timeout: float = 90.0

    def key(self) -> tuple:
        return tuple(sorted(self.options.items())), self.timeout, self.retries, self.retry_timeout


class ObjectInfo(NamedTuple):
    """What the store says of an object: its size and ETag (what the node cache and the index are keyed by)."""
    url: str
    size: int
    etag: str
    mtime_ns: int = 0


_owner = 0
"""The process that first spoke to a store (obstore's runtime lives there): 0 before any request."""

_ENVIRONMENT = ("AWS_", "GOOGLE_", "AZURE_", "ALLOW_HTTP")
_clients: weakref.WeakValueDictionary[tuple, "Client"] = weakref.WeakValueDictionary()
"""The clients held now (by node caches, listings under way), by settings and store environment:
not an owner (a client is its holders'), only how a second holder finds the first one's."""
_clients_lock = threading.Lock()


def client_for(settings: Settings) -> "Client":
    """The client of these settings: the same one while they and the stores' environment variables
    are unchanged and something holds it (its stores, one per bucket or host, are reused: the node
    cache a loader opened lists, stats and fetches with one client), a new one where either differs
    or none is held."""
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENVIRONMENT)))
    key = (settings.key(), environment)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = Client(settings)
        return client


def check_process(url: str) -> None:
    """Refuse to speak to a store from a process forked after this one's runtime ran: it would hang."""
    if _owner and _owner != os.getpid():
        raise StoreError(f"{url}: this process was forked from process {_owner} after it read from the object "
                         f"store, and the store's client (obstore) cannot run in a forked copy (it would hang); build "
                         f"the loader in process {_owner}, or start this process with the spawn or forkserver method")


class OddPath(ConfigError):
    """A URL whose path has an empty, '.' or '..' part (what _split refuses), for the key that gave it."""


def _split(url: str) -> tuple[str, str]:
    """(the store's root URL, the object's path in it): s3://bucket/a/b -> (s3://bucket, a/b).
    ConfigError for a path with an empty, '.' or '..' part: a store's keys are taken literally (the
    client refuses them), so `a/../b` and `a//b` name no object a user meant."""
    scheme, rest = url.split("://", 1)
    authority, _, path = rest.partition("/")
    odd = [part for part in path.rstrip("/").split("/") if part in ("", ".", "..")] if path.rstrip("/") else []
    if odd:
        which = repr(odd[0]) if odd[0] else "an empty part"
        raise OddPath(f"{url}: an object store's path has no empty, '.' or '..' part (its keys are taken "
                          f"literally, and {path!r} has {which}): write the URL without '//', './' or '../', e.g. "
                          f"{scheme}://{authority}/{_tidy(path)}")
    return f"{scheme}://{authority}", path


def _tidy(path: str) -> str:
    """A path with its empty and '.' parts dropped and its '..' parts resolved: the fix a message offers."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


_ENDPOINT_OPTIONS = ("endpoint", "endpoint_url", "aws_endpoint", "aws_endpoint_url", "google_base_url",
                     "azure_storage_endpoint", "azure_endpoint")
_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "GOOGLE_BASE_URL", "AZURE_STORAGE_ENDPOINT")


def _truthy(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes")


def _check_endpoint(options: Mapping[str, str], allow_http: bool) -> None:
    """An endpoint that is no http(s) URL, or an http:// one without allow_http, refused at once: the
    client panics on the first (a BaseException past every `except Exception`) and retries the second
    for the whole retry budget ("builder error"), though neither can ever succeed."""
    from urllib.parse import urlsplit

    given = [(f"dataset.remote.options.{key}", str(value)) for key, value in options.items()
             if key.lower() in _ENDPOINT_OPTIONS]
    given += [(f"the environment variable {name}", os.environ[name]) for name in _ENDPOINT_VARIABLES
              if os.environ.get(name)]
    for where, endpoint in given:
        try:
            parts = urlsplit(endpoint)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname) and " " not in endpoint
            parts.port  # noqa: B018 (raises ValueError for a port that is no number)
        except ValueError:
            valid = False
        if not valid:
            raise ConfigError(f"{where}: {endpoint!r} is not an endpoint URL; give the store's address as "
                              f"http(s)://HOST[:PORT], e.g. https://s3.example.com or http://127.0.0.1:9000")
        if parts.scheme == "http" and not allow_http:
            raise ConfigError(f"{where}: {endpoint!r} is plain HTTP, which the client refuses unless told: set "
                              f"AWS_ALLOW_HTTP=true (or dataset.remote.options.allow_http: 'true'), or use an "
                              f"https:// endpoint")


def _is_panic(error: BaseException) -> bool:
    """obstore's Rust code panicked (pyo3's PanicException: a BaseException, not an Exception)."""
    return type(error).__name__ == "PanicException"


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:400]


# -- errors ------------------------------------------------------------------------------------------


class OddKeyError(ConfigError):
    """A listing met an object whose key the client refuses (`a//b`): no listing of that folder can pass."""


class Changed(Exception):
    """The object is no longer the one indexed: its ETag changed (If-Match failed)."""


def _explain(error: BaseException, url: str, doing: str, settings: Settings) -> BaseException:
    """The client's error as one that names the URL and what to set: FileNotFoundError (no such
    object), ConfigError (refused credentials, a bad option), Changed, or StoreError (unreachable)."""
    from obstore import exceptions

    text = _first_line(error)
    credentials, where = _VARIABLES[kind(url)]
    if isinstance(error, (exceptions.NotFoundError, FileNotFoundError)):
        return FileNotFoundError(2, f"no such object ({doing})", url)
    if isinstance(error, exceptions.PreconditionError):
        return Changed(url)
    if isinstance(error, (exceptions.PermissionDeniedError, exceptions.UnauthenticatedError)) or \
            any(word in text for word in ("403 Forbidden", "401 Unauthorized", "InvalidAccessKeyId",
                                          "SignatureDoesNotMatch")):
        return ConfigError(f"{url}: the store refused the request ({doing}): {text}. Check the credentials: "
                           f"{credentials}, or dataset.remote.options")
    if "NoSuchBucket" in text or "404 Not Found" in text:
        bucket = _split(url)[0]
        return ConfigError(f"{url}: the bucket {bucket} does not exist ({doing}). Check the URL"
                           f"{f', or {where}' if where else ''}")
    if isinstance(error, exceptions.UnknownConfigurationKeyError):
        return ConfigError(f"dataset.remote.options: {text}")
    if isinstance(error, exceptions.InvalidPathError):
        return OddKeyError(f"{url}: {doing} failed: {text}. The store holds an object whose key the client cannot "
                           f"take (an empty, '.' or '..' part, as in 'a//b'); rename or delete that object, keep "
                           f"the shards in a folder of their own, or name them with a brace range "
                           f"(train-{{000000..000099}}.tar), which needs no listing")
    if "builder error" in text or _is_panic(error):  # the client could not even build the request: no retry helps
        return ConfigError(f"{url}: {doing} failed: the client could not make the request ({text}); check "
                           f"dataset.remote.options and {where or 'the URL'}")
    where_hint = f"; check the network, or {where}" if where else "; check the network"
    return StoreError(f"{url}: {doing} failed after {settings.retries} retries within "
                      f"dataset.remote.retry_timeout ({settings.retry_timeout:g} s): {text}{where_hint}")


# -- what is where -------------------------------------------------------------------------------------


def _meta(url: str, meta: Mapping) -> ObjectInfo:
    modified = meta.get("last_modified")
    return ObjectInfo(url, int(meta["size"]), str(meta.get("e_tag") or ""),
                      int(modified.timestamp() * 1e9) if modified is not None else 0)


def _matches(path: str, pattern: str) -> bool:
    """fnmatch per folder level, as glob does: `*` never crosses a '/'."""
    parts, wanted = path.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted))


has_magic = local_glob.has_magic


# -- the client: listings, sizes and bytes --------------------------------------------------------------


class Client:
    """One dataset.remote's client settings and the stores made with them (one per bucket or host):
    what lists, stats and reads objects. `client_for` gives it; nothing here is set for the process."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._stores: dict[str, object] = {}
        self._lock = threading.Lock()

    def _store(self, root: str):
        global _owner
        check_process(root)
        with self._lock:
            store = self._stores.get(root)
            if store is not None:
                return store
            from obstore.exceptions import BaseError
            from obstore.store import from_url

            timeout = f"{self.settings.timeout}s"
            client = {"timeout": timeout, "connect_timeout": f"{min(self.settings.timeout, 10.0)}s"}
            allow_http = os.environ.get("AWS_ALLOW_HTTP", "") or os.environ.get("ALLOW_HTTP", "")
            if root.startswith("http://") or _truthy(allow_http):
                client["allow_http"] = True  # given client options, obstore no longer reads AWS_ALLOW_HTTP itself
            settings = self.settings
            retry = {"max_retries": settings.retries, "retry_timeout": timedelta(seconds=settings.retry_timeout),
                     "backoff": {"init_backoff": timedelta(seconds=0.1), "max_backoff": timedelta(seconds=15),
                                 "base": 2}}
            options = dict(self.settings.options)
            if "allow_http" in options:
                client["allow_http"] = _truthy(options.pop("allow_http"))
            if kind(root) != "https":
                _check_endpoint(options, bool(client.get("allow_http")))
            try:
                if kind(root) == "https":
                    store = from_url(root, client_options=client, retry_config=retry)
                else:
                    store = from_url(root, config=options or None, client_options=client, retry_config=retry)
            except BaseException as error:
                if not isinstance(error, BaseError) and not _is_panic(error):
                    raise
                raise ConfigError(f"dataset.remote.options: {_first_line(error)} (for {root}); the options are "
                                  f"obstore's for this kind of store (docs/clusters.md#shards-in-an-object-store)"
                                  ) from None
            _owner = _owner or os.getpid()
            self._stores[root] = store
            return store

    def _retrying(self, url: str, doing: str, call: Callable):
        """call(), its client's errors explained. The client retries a request that failed before its
        body came (5xx, refused or reset connections, timeouts); a body cut short is retried here, with
        backoff, within the same dataset.remote.retry_timeout. So is a request whose client retries were
        all spent before that time: the client's backoff is jittered, and its 10 retries once ended
        within 1.4 s of a store that was back 1.5 s after it went away."""
        from obstore.exceptions import BaseError, NotFoundError, PermissionDeniedError, PreconditionError

        started, delay = time.monotonic(), 0.1
        while True:
            try:
                return call()
            except (NotFoundError, PermissionDeniedError, PreconditionError, FileNotFoundError) as error:
                raise _explain(error, url, doing, self.settings) from None
            except BaseException as error:
                if not isinstance(error, (BaseError, OSError)) and not _is_panic(error):
                    raise
                explained = _explain(error, url, doing, self.settings)
                late = time.monotonic() - started + delay > self.settings.retry_timeout
                if not isinstance(explained, StoreError) or late:
                    raise explained from None
                time.sleep(delay)
                delay = min(delay * 2, 15.0)

    def stat(self, url: str) -> ObjectInfo:
        """The object's size and ETag (a HEAD request); FileNotFoundError where there is none."""
        import obstore

        root, path = _split(url)
        store = self._store(root)
        return self._retrying(url, "reading its size", lambda: _meta(url, obstore.head(store, path)))

    def _listing(self, folder_url: str) -> dict[str, ObjectInfo]:
        """The objects directly in a folder (`s3://bucket/a/`), by URL: one listing request per 1,000."""
        import obstore

        root, prefix = _split(folder_url)
        store = self._store(root)
        prefix = prefix.rstrip("/")

        def listed() -> dict[str, ObjectInfo]:
            result = obstore.list_with_delimiter(store, prefix=f"{prefix}/" if prefix else None)
            return {f"{root}/{meta['path']}": _meta(f"{root}/{meta['path']}", meta) for meta in result["objects"]}
        return self._retrying(folder_url, "listing its objects", listed)

    def stat_many(self, urls: Sequence[str]) -> dict[str, ObjectInfo | BaseException]:
        """Each URL's ObjectInfo, or the error that says why there is none (FileNotFoundError: no such
        object). Where a folder holds several, one listing says their sizes and ETags; else a HEAD each,
        in parallel. A missing bucket or refused credentials raise (ConfigError) at once."""
        folders: dict[str, list[str]] = {}
        for url in urls:
            folders.setdefault(url.rsplit("/", 1)[0], []).append(url)
        found: dict[str, ObjectInfo | BaseException] = {}
        heads = []
        for folder, members in folders.items():
            listed = None
            if len(members) >= LISTED_FROM and kind(folder) != "https":
                try:
                    listed = self._listing(folder)
                except OddKeyError as error:  # an odd key beside them: each is looked up by itself instead
                    log.warning("%s; the %d shards named in it are looked up one by one instead", error, len(members))
            if listed is not None:
                for url in members:
                    found[url] = listed.get(url) or FileNotFoundError(2, "no such object", url)
            else:
                heads += members
        with ThreadPoolExecutor(min(STAT_THREADS, max(1, len(heads)))) as pool:
            for url, result in zip(heads, pool.map(self._stat_or_error, heads)):
                found[url] = result
        missing = [url for url in urls if isinstance(found[url], FileNotFoundError)]
        if missing and len(missing) == len(urls):
            self._check_bucket(missing[0])
        for result in found.values():
            if isinstance(result, ConfigError):
                raise result
        return found

    def _stat_or_error(self, url: str) -> ObjectInfo | BaseException:
        try:
            return self.stat(url)
        except (OSError, ConfigError) as error:
            return error

    def _check_bucket(self, url: str) -> None:
        """A missing object whose bucket is missing too: a ConfigError that says so (a HEAD cannot tell)."""
        if kind(url) != "https":
            self._listing(url.rsplit("/", 1)[0])

    def glob(self, pattern: str) -> list[ObjectInfo]:
        """The objects whose URL matches a glob (`s3://bucket/train-*.tar`), sorted: a listing of the
        folders before the first wildcard, matched as `glob` matches paths (`*` within one folder)."""
        if kind(pattern) == "https":
            raise ConfigError(f"{pattern}: an https:// URL cannot be a glob (an HTTP server has no listing); name the "
                              f"shards with a brace range, e.g. train-{{000000..000099}}.tar")
        import obstore

        root, path = _split(pattern)
        fixed = path[:min(path.index(c) for c in "*?[" if c in path)]
        folder = fixed.rsplit("/", 1)[0] if "/" in fixed else ""
        store = self._store(root)

        def listed() -> list[ObjectInfo]:
            objects = []
            for page in obstore.list(store, prefix=f"{folder}/" if folder else None):
                objects += [_meta(f"{root}/{meta['path']}", meta) for meta in page
                            if _matches(meta["path"], path)]
            return sorted(objects)
        return self._retrying(pattern, "listing the objects it matches", listed)

    def read_range(self, url: str, start: int, length: int, etag: str = "") -> bytes:
        """`length` bytes from `start` (fewer at the object's end); an ETag makes it conditional (Changed)."""
        import obstore

        if length <= 0:
            return b""
        root, path = _split(url)
        store = self._store(root)
        options: dict = {"range": (start, start + length)}
        if etag:
            options["if_match"] = etag
        return self._retrying(url, f"reading bytes {start}-{start + length}",
                         lambda: bytes(obstore.get(store, path, options=options).bytes()))

    def read_object(self, url: str) -> bytes:
        """A small object whole (an index beside a shard, a classes file); FileNotFoundError where there is none."""
        import obstore

        root, path = _split(url)
        store = self._store(root)
        return self._retrying(url, "reading it", lambda: bytes(obstore.get(store, path).bytes()))

    def download(self, info: ObjectInfo, fd: int, on_bytes: Callable[[int], None] | None = None) -> None:
        """The whole object into the open file `fd` (from offset 0), in ranged requests of PART_BYTES,
        each conditional on the ETag indexed (Changed when it differs) and retried on its own."""
        import obstore

        root, path = _split(info.url)
        store = self._store(root)
        for start in range(0, info.size, PART_BYTES):
            end = min(info.size, start + PART_BYTES)
            options: dict = {"range": (start, end)}
            if info.etag:
                options["if_match"] = info.etag

            def part(start=start, end=end, options=options) -> None:
                written = start
                for chunk in obstore.get(store, path, options=options).stream(min_chunk_size=1 << 20):
                    view = memoryview(chunk)
                    while len(view):
                        try:
                            count = os.pwrite(fd, view, written)
                        except OSError as error:  # the local disk's, not the store's: never retried
                            raise _Written(error) from None
                        view, written = view[count:], written + count
                if written != end:
                    raise StoreError(f"{info.url}: the store sent {written - start} bytes of bytes {start}-{end}")
            try:
                self._retrying(info.url, f"downloading bytes {start}-{end} of {info.size}", part)
            except _Written as failed:
                raise failed.error from None
            if on_bytes:
                on_bytes(end - start)


class _Written(Exception):
    """A write to the local file failed (a full disk): carried past the retries of the store's errors."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class RangeFile:
    """A read-only file over ranged requests, for `tarfile` to walk a remote shard's headers: reads
    go through a few cached blocks of BLOCK bytes, so that a member's header, its label member and
    the next header are mostly one request; `pread` as os.pread."""

    BLOCK = 64 << 10

    def __init__(self, info: ObjectInfo, client: Client):
        self.info, self.client, self.position = info, client, 0
        self.blocks: dict[int, bytes] = {}
        self.requests = 0

    def _block(self, number: int) -> bytes:
        block = self.blocks.get(number)
        if block is None:
            if len(self.blocks) >= 4:
                self.blocks.pop(next(iter(self.blocks)))
            block = self.client.read_range(self.info.url, number * self.BLOCK, self.BLOCK, self.info.etag)
            self.blocks[number] = block
            self.requests += 1
        return block

    def pread(self, length: int, offset: int) -> bytes:
        end = min(offset + max(length, 0), self.info.size)
        pieces = []
        while offset < end:
            number, within = divmod(offset, self.BLOCK)
            piece = self._block(number)[within:within + end - offset]
            if not piece:
                break
            pieces.append(piece)
            offset += len(piece)
        return b"".join(pieces)

    def read(self, size: int = -1) -> bytes:
        data = self.pread(self.info.size - self.position if size is None or size < 0 else size, self.position)
        self.position += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.position = offset if whence == 0 else self.position + offset if whence == 1 else self.info.size + offset
        return self.position

    def tell(self) -> int:
        return self.position


def in_parallel(function: Callable, items: Sequence, on_done: Callable[[int], None] | None = None,
                threads: int = STAT_THREADS) -> Iterator:
    """function(item) for each item, in threads (the client releases the GIL), results in order."""
    if not items:
        return iter(())
    with ThreadPoolExecutor(min(threads, len(items))) as pool:
        results = []
        for done, result in enumerate(pool.map(function, items), 1):
            results.append(result)
            if on_done:
                on_done(done)
    return iter(results)


def common_root(urls: Sequence[str]) -> str:
    """The longest folder URL above every URL (`s3://bucket/prefix`), which sample names are relative to."""
    folders = [url.rsplit("/", 1)[0].split("/") for url in urls]
    common = folders[0]
    for parts in folders[1:]:
        same = 0
        while same < min(len(common), len(parts)) and common[same] == parts[same]:
            same += 1
        common = common[:same]
    return "/".join(common) if len(common) > 3 or (len(common) == 3 and common[2]) else "/".join(folders[0][:3])


def relative(url: str, root: str) -> str:
    """The URL's name under root (`root/a/b.tar` -> `a/b.tar`), or the URL itself where it is not under it."""
    prefix = root.rstrip("/") + "/"
    return url[len(prefix):] if url.startswith(prefix) else url


def join(root: str, name: str) -> str:
    return name if is_url(name) else f"{root.rstrip('/')}/{name.lstrip('/')}"
