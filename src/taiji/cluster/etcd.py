"""etcd v3 as a job store, through its HTTP/JSON gateway (client: ``etcd3gw``, which needs only
``requests``; the gRPC clients break on current protobuf releases —
docs/reference/many-hosts-notes.md#etcd-client).

``EtcdKV`` gives etcd the semantics taiji relies on from ``torch.distributed.TCPStore`` (cluster/kv.py's
``KeyValue``): blocking ``get``/``wait`` with a timeout, compare-and-set (a transaction on the key's value, or
on its absence), atomic ``add`` (a transaction on the key's modification revision, retried on a race), and
leases and watches besides. ``EtcdC10dStore`` (cluster/etcd_store.py) wraps it as a
``torch.distributed.Store`` so gloo's rendezvous runs on the same etcd. Waits poll with a short backoff: a
worker's config watcher and a group's rendezvous wait seldom and briefly.
"""

from __future__ import annotations

import base64
import datetime
import json
import math
import os
import threading
import time
from collections.abc import Generator, Iterator
from typing import Any

from .. import env
from ..errors import AuthError, ConfigError, StoreError
from .auth import derive

POLL_START_S = 0.005
POLL_MAX_S = 0.05
RETRY_S = 10.0  # how long a request is retried through an election or an unreachable member
WATCH_REOPEN_S = (
    5.0  # an idle watch is reopened (from where it was) this often, how soon a stop is seen: not often
)
MIN_LEASE_S = 2  # etcd rounds shorter leases up to about this (1.5 election timeouts)
TRANSIENT = ("leader changed", "request timed out", "no leader", "too many requests", "not capable")


class _Transient(Exception):
    """No endpoint answered, or the cluster is between leaders: worth another try."""


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else bytes(data)).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _holds(key: str, value: bytes) -> dict:
    """A transaction's comparison: ``key`` holds ``value`` (b"": ``key`` is absent)."""
    if value == b"":
        return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
    return {"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(value)}


SCHEMES = ("etcd://", "etcds://")  # etcds: over TLS (certificates from TAIJI_ETCD_CA/CERT/KEY, env.py)


def is_etcd_url(url: str) -> bool:
    return url.startswith(SCHEMES)


def parse_url(url: str) -> list[tuple[str, int]]:
    """``etcd://h1:2379,h2:2379`` (or ``etcds://``, TLS) -> [(h1, 2379), (h2, 2379)]."""
    if not is_etcd_url(url):
        raise ConfigError(f"an etcd store URL starts with etcd:// (or etcds:// for TLS), got {url!r}")
    endpoints = []
    for part in url.split("://", 1)[1].split(","):
        host, colon, port = part.rpartition(":")
        if not (host and colon and port.isdigit()):
            raise ConfigError(f"expected etcd://HOST:PORT[,HOST:PORT...] (etcds:// for TLS), got {url!r}")
        endpoints.append((host.strip("[]"), int(port)))
    return endpoints


def job_credentials(job_id: str, secret: bytes) -> tuple[str, str]:
    """The job's etcd user and password (the password derived from the job secret)."""
    return f"taiji-{job_id}", derive(secret, "etcd").hex()


class _Login:
    """A token that connections to one cluster, as one user, share; renewed under ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.token: str | None = None
        self.count = 0  # authentications so far


def _scan(prefix: str) -> dict:
    """A range request's keys: every key under ``prefix``."""
    return {"key": _b64(prefix), "range_end": _b64(prefix[:-1] + chr(ord(prefix[-1]) + 1))}


class EtcdKV:
    """One connection (an HTTP session) to an etcd cluster; give each thread its own.

    With ``credentials`` (user, password) it authenticates when the cluster has auth on, and
    again when its token expires; a cluster without auth is used as it is. Connections made by
    ``another()`` share the first one's token (``_Login``) rather than authenticating each."""

    def __init__(
        self,
        url: str,
        timeout: float = 60.0,
        credentials: tuple[str, str] | None = None,
        login: _Login | None = None,
    ):
        try:
            from etcd3gw import exceptions
            from etcd3gw.client import Etcd3Client
        except ImportError:
            raise ConfigError("the etcd store needs the etcd3gw package: pip install 'taiji[etcd]'") from None
        self.url = url
        self._timeout = timeout
        self._errors = (exceptions.Etcd3Exception,)
        tls = url.startswith("etcds://")
        files = {
            "ca_cert": env.ETCD_CA.get() or None,
            "cert_cert": env.ETCD_CERT.get() or None,
            "cert_key": env.ETCD_KEY.get() or None,
        }
        for name, path in files.items():
            if tls and path is not None and not os.path.isfile(path):
                raise ConfigError(f"the etcd TLS file {path!r} ({name}, from the environment) does not exist")
        if tls and (files["cert_cert"] is None) != (files["cert_key"] is None):
            raise ConfigError(
                f"a client certificate needs its key: set both {env.ETCD_CERT.name} and "
                f"{env.ETCD_KEY.name} (--etcd-cert and --etcd-key)"
            )
        self._clients = [
            Etcd3Client(
                host=h,
                port=p,
                timeout=min(timeout, 10.0),
                protocol="https" if tls else "http",
                **(files if tls else {}),
            )
            for h, p in parse_url(url)
        ]
        if tls and files["ca_cert"] is not None:
            for client in self._clients:
                # requests lets REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE override a session's CA: ours must win
                client.session.trust_env = False
        self._current = 0
        self._credentials = credentials
        self._login = login if login is not None else (_Login() if credentials is not None else None)
        if credentials is not None and login is None:
            self._authenticate(None)

    def _authenticate(self, stale: str | None) -> None:
        """Get a token for every connection sharing this one's login — unless another of them
        already replaced ``stale`` (the token this one found expired) meanwhile."""
        assert self._credentials is not None and self._login is not None
        user, password = self._credentials
        with self._login.lock:
            if self._login.token != stale:
                return
            try:
                token = self._post("/auth/authenticate", {"name": user, "password": password}, as_user=False)[
                    "token"
                ]
            except StoreError as exc:
                if "authentication is not enabled" in str(exc):
                    return  # an open cluster: nothing to present
                if "authentication failed" in str(exc):
                    raise AuthError(
                        f"etcd at {self.url} refused user {user}: the password derived from the job "
                        "secret does not match (a wrong secret file?)"
                    ) from None
                raise
            self._login.token = token
            self._login.count += 1

    def _present(self, client: Any, token: str | None) -> None:
        """Put ``token`` (None: none) on ``client``'s requests."""
        headers = client.session.headers
        if token is None:
            headers.pop("Authorization", None)
        elif headers.get("Authorization") != token:
            headers["Authorization"] = token

    # -- transport -------------------------------------------------------------------------

    def _post(self, path: str, payload: dict, as_user: bool = True) -> dict:
        """POST to the first endpoint that answers (the others are tried in turn), through
        elections and brief outages for up to ``RETRY_S``; ``as_user``: with the login's token
        (an expired one is renewed once), else with none."""
        deadline = time.monotonic() + min(self._timeout, RETRY_S)
        pause = POLL_START_S
        while True:
            try:
                return self._post_once(path, payload, as_user)
            except _Transient as exc:
                if time.monotonic() >= deadline:
                    hint = ""
                    if self.url.startswith("etcd://") and "without response" in str(exc):
                        hint = (
                            " (an etcd that serves TLS hangs up on plain HTTP like this: "
                            "if it does, write the "
                            f"store as {self.url.replace('etcd://', 'etcds://', 1)})"
                        )
                    raise StoreError(f"etcd at {self.url} did not answer {path}: {exc}{hint}") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    def _post_once(self, path: str, payload: dict, as_user: bool, renewed: bool = False) -> dict:
        last = tls_failure = ""
        for attempt in range(len(self._clients)):
            client = self._clients[(self._current + attempt) % len(self._clients)]
            token = self._login.token if self._login is not None and as_user else None
            self._present(client, token)
            try:
                result = client.post(client.get_url(path), json=payload)
                if (
                    "error" in result
                ):  # a streaming call (a lease's keep-alive) fails in its body: the gateway says 200
                    raise _Transient(str(result["error"])[:300])
                self._current = (self._current + attempt) % len(self._clients)
                return result
            except self._errors as exc:
                detail = str(getattr(exc, "detail_text", "") or exc)
                if (
                    "invalid auth token" in detail
                    and as_user
                    and not renewed
                    and self._credentials is not None
                ):
                    self._authenticate(token)
                    return self._post_once(path, payload, as_user, renewed=True)
                if any(word in detail for word in ("CERTIFICATE", "certificate", "SSLError")):
                    tls_failure = detail  # this member's; another may still answer
                    continue
                if "permission denied" in detail:
                    raise AuthError(
                        f"etcd at {self.url}: permission denied for {path} (this job's etcd user may "
                        "touch only its own keys)"
                    ) from None
                if any(word in detail for word in TRANSIENT):
                    raise _Transient(detail) from None
                if any(word in detail for word in ("etcdserver:", "authentication")):
                    raise StoreError(f"etcd at {self.url} refused {path}: {detail}") from None
                last = detail
        if tls_failure:
            raise StoreError(
                f"etcd at {self.url}: the TLS handshake failed ({tls_failure[:300]}). Give the CA that "
                f"signed its certificate in {env.ETCD_CA.name} (--etcd-ca), and a client certificate in "
                f"{env.ETCD_CERT.name}/{env.ETCD_KEY.name} if it asks for one"
            ) from None
        raise _Transient(last)

    def reachable(self) -> None:
        """Raise StoreError unless an endpoint answers (needs no permission)."""
        self._post("/maintenance/status", {})

    def _range(self, key: str) -> dict | None:
        kvs = self._post("/kv/range", {"key": _b64(key)}).get("kvs")
        return kvs[0] if kvs else None

    def _txn(self, compare: list[dict], success: list[dict], failure: list[dict]) -> dict:
        return self._post("/kv/txn", {"compare": compare, "success": success, "failure": failure})

    # -- the KeyValue protocol -------------------------------------------------------------

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout = timeout.total_seconds()

    @property
    def timeout(self) -> float:
        """How long a blocking call waits (seconds)."""
        return self._timeout

    def set(self, key: str, value: str | bytes, lease: int | None = None) -> None:
        payload = {"key": _b64(key), "value": _b64(value)}
        if lease is not None:
            payload["lease"] = str(lease)
        self._post("/kv/put", payload)

    def _value(self, key: str) -> bytes | None:
        kv = self._range(key)
        return None if kv is None else _unb64(kv.get("value", ""))

    def get(self, key: str) -> bytes:
        value = self._value(key)  # one round trip for a key that is there
        if value is None:  # not written yet: wait for it (TCPStore's semantics)
            self.wait([key], datetime.timedelta(seconds=self._timeout))
            value = self._value(key)
        if value is None:
            raise StoreError(f"etcd key {key!r} vanished while being read")
        return value

    def check(self, keys: list[str]) -> bool:
        return all(self._range(k) is not None for k in keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        limit = self._timeout if timeout is None else timeout.total_seconds()
        deadline = time.monotonic() + limit
        pause = POLL_START_S
        missing = list(keys)
        while True:
            missing = [k for k in missing if self._range(k) is None]
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise StoreError(f"etcd at {self.url}: wait timeout after {limit:g}s for keys {missing}")
            time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, POLL_MAX_S)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """TCPStore's semantics: set ``desired`` if the value is ``expected`` (an empty ``expected``:
        if the key is absent); return the value after the call (``expected`` if absent and not set)."""
        want = expected.encode() if isinstance(expected, str) else bytes(expected)
        new = desired.encode() if isinstance(desired, str) else bytes(desired)
        result = self._txn(
            [_holds(key, want)],
            [{"request_put": {"key": _b64(key), "value": _b64(new)}}],
            [{"request_range": {"key": _b64(key)}}],
        )
        if result.get("succeeded"):
            return new
        kvs = result["responses"][0]["response_range"].get("kvs")
        return _unb64(kvs[0].get("value", "")) if kvs else want

    def put_if(self, expected: dict[str, bytes], puts: dict[str, str | bytes]) -> bool:
        """Write every key of ``puts`` in one transaction if every key of ``expected`` holds its
        value (b"": is absent); False (nothing written) if one does not."""
        success = [{"request_put": {"key": _b64(k), "value": _b64(v)}} for k, v in puts.items()]
        return bool(self._txn([_holds(k, v) for k, v in expected.items()], success, []).get("succeeded"))

    def add(self, key: str, amount: int) -> int:
        """Atomic add (``amount`` 0: a read); a lost race answers the key as it is now: one round trip a
        retry."""
        kv = self._range(key)
        while True:
            current = int(_unb64(kv.get("value", "")) or b"0") if kv else 0
            if amount == 0:
                return current
            compare = [
                _holds(key, b"")
                if kv is None
                else {
                    "key": _b64(key),
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": kv["mod_revision"],
                }
            ]
            done = self._txn(
                compare,
                [{"request_put": {"key": _b64(key), "value": _b64(str(current + amount))}}],
                [{"request_range": {"key": _b64(key)}}],
            )
            if done.get("succeeded"):
                return current + amount
            kv = (done["responses"][0]["response_range"].get("kvs") or [None])[0]

    def put_counted(self, puts: dict[str, str | bytes], prefix: str) -> int:
        """Write every key of ``puts`` and count the keys under ``prefix`` then, in one transaction
        with no comparison (it cannot lose a race, so is never retried): the n-th new key written
        under ``prefix`` answers n."""
        success = [{"request_put": {"key": _b64(k), "value": _b64(v)}} for k, v in puts.items()]
        done = self._txn([], success + [{"request_range": {**_scan(prefix), "count_only": True}}], [])
        return int(done["responses"][-1]["response_range"].get("count", 0))

    def created_after(self, prefix: str, revision: int) -> tuple[int, list[tuple[str, bytes]]]:
        """The keys under ``prefix`` created after ``revision``, with their values, oldest first, and
        the revision read at (the next call's ``revision``: nothing created by then is missed)."""
        answer = self._post(
            "/kv/range",
            {
                **_scan(prefix),
                "min_create_revision": str(revision + 1),
                "sort_target": "CREATE",
                "sort_order": "ASCEND",
            },
        )
        found = [(_unb64(kv["key"]).decode(), _unb64(kv.get("value", ""))) for kv in answer.get("kvs", ())]
        return int(answer["header"]["revision"]), found

    def delete_key(self, key: str) -> bool:
        return int(self._post("/kv/deleterange", {"key": _b64(key)}).get("deleted", 0)) > 0

    # -- leases and watches ------------------------------------------------------------------

    def grant_lease(self, ttl: float) -> int:
        """A lease of ``ttl`` seconds (rounded up; etcd makes short ones about 2 s)."""
        return int(self._post("/lease/grant", {"TTL": max(MIN_LEASE_S, math.ceil(ttl)), "ID": 0})["ID"])

    def renew_lease(self, lease: int) -> bool:
        """Keep ``lease`` alive; False if it has expired (its keys are gone)."""
        return int(self._post("/lease/keepalive", {"ID": str(lease)})["result"].get("TTL", 0)) > 0

    def revoke_lease(self, lease: int) -> None:
        self._post("/lease/revoke", {"ID": str(lease)})

    def changes(self, key: str, stop: threading.Event) -> Iterator[bytes | None]:
        """The key's value now (None: absent), then its value at every change (None: deleted), until ``stop``.
        One streaming watch, reopened from the last revision it saw when idle for ``WATCH_REOPEN_S`` (so a
        stop is noticed) or when the connection broke: no change is missed. Use a connection of its own
        (``another()``)."""
        return (value for _, value in self._follow({"key": _b64(key)}, stop))

    def changes_under(self, prefix: str, stop: threading.Event) -> Iterator[tuple[str, bytes | None]]:
        """``changes`` for every key under ``prefix``: each one's name and value now, then at each
        put or delete (None) under it (after a compaction, the keys there then, afresh)."""
        return self._follow(_scan(prefix), stop)

    def changes_from(
        self, key: str, prefix: str, stop: threading.Event
    ) -> Iterator[tuple[str, bytes | None]]:
        """``key``'s value now (None: absent), then every put or delete under ``prefix`` (which holds
        ``key``), each with its key's name, until ``stop``: one watch whose events carry the values, and
        only one key read first, not the prefix (after a compaction, ``key``'s value then, afresh)."""
        return self._follow(_scan(prefix), stop, first={"key": _b64(key)})

    def _follow(
        self, scan: dict, stop: threading.Event, first: dict | None = None
    ) -> Iterator[tuple[str, bytes | None]]:
        """The changes ``scan`` covers, after what ``first`` (default: ``scan``) holds now."""
        import requests

        first = first or scan

        def current() -> tuple[int, list[tuple[str, bytes | None]]]:  # (a single key absent: None)
            answer = self._post("/kv/range", first)
            found = [
                (_unb64(kv["key"]).decode(), _unb64(kv.get("value", ""))) for kv in answer.get("kvs", ())
            ]
            return int(answer["header"]["revision"]), found or (
                [] if "range_end" in first else [(_unb64(first["key"]).decode(), None)]
            )

        revision, found = current()
        yield from found
        while not stop.is_set():
            token = self._login.token if self._login is not None else None
            try:
                for result in self._watch({**scan, "start_revision": revision + 1}, WATCH_REOPEN_S):
                    if stop.is_set():
                        return
                    if result.get("canceled"):  # compacted past our revision: read afresh
                        revision, found = current()
                        yield from found
                        break
                    for event in result.get("events", ()):
                        revision, kv = int(event["kv"]["mod_revision"]), event["kv"]
                        yield (
                            _unb64(kv["key"]).decode(),
                            None if event.get("type") == "DELETE" else _unb64(kv.get("value", "")),
                        )
            except (requests.RequestException, _Transient, ValueError, KeyError) as exc:
                if isinstance(exc, requests.ConnectionError) and "Read timed out" in str(exc):
                    continue  # an open stream with nothing new: reopen it on the same member
                if "auth token" in str(exc) and self._credentials is not None:
                    self._authenticate(token)
                else:  # a member that is down, partitioned or refusing: the next one, after a pause
                    self._current = (self._current + 1) % len(self._clients)
                stop.wait(POLL_MAX_S)

    def _watch(self, request: dict, quiet_s: float) -> Iterator[dict]:
        """One watch stream on the current member: its results, until the server ends it (or
        ``quiet_s`` pass without a line: requests' read timeout). _Transient for a refusal."""
        client = self._clients[self._current]
        self._present(client, self._login.token if self._login is not None else None)
        with client.session.post(
            client.get_url("/watch"),
            json={"create_request": request},
            stream=True,
            timeout=(min(self._timeout, 10.0), quiet_s),
        ) as response:
            for line in response.iter_lines():
                result = json.loads(line).get("result") if line.strip() else None
                if result is None or (result.get("canceled") and not result.get("compact_revision")):
                    raise _Transient(line.decode(errors="replace")[:300])  # an error, or a refusal
                yield result

    def read_prefix(self, prefix: str, put: tuple[str, bytes] | None = None) -> tuple[int, dict[str, bytes]]:
        """Every key under ``prefix`` with its value, and the revision read at: one round trip,
        which first writes ``put`` (key, value) if given."""
        scan = _scan(prefix)
        if put is None:
            answer = self._post("/kv/range", scan)
        else:
            done = self._txn(
                [],
                [{"request_put": {"key": _b64(put[0]), "value": _b64(put[1])}}, {"request_range": scan}],
                [],
            )
            answer = dict(done["responses"][1]["response_range"], header=done["header"])
        found = {_unb64(kv["key"]).decode(): _unb64(kv.get("value", "")) for kv in answer.get("kvs", ())}
        return int(answer["header"]["revision"]), found

    def puts_under(self, prefix: str, quiet_s: float) -> Generator[tuple[str, bytes] | None, None, None]:
        """None once a watch of ``prefix`` is live (a read of the prefix then misses nothing), then each
        key written under it with its value; ends after ``quiet_s`` without a line. From now, not from a
        past revision: etcd gives a watch that starts in the past its events only at its next catch-up
        of such watches (every 100 ms) once anything was written since. StoreError if it fails."""
        import requests

        try:
            for result in self._watch(_scan(prefix), quiet_s):
                if result.get("created"):
                    yield None
                for event in result.get("events", ()):
                    if event.get("type") != "DELETE":
                        yield _unb64(event["kv"]["key"]).decode(), _unb64(event["kv"].get("value", ""))
        except requests.ConnectionError as exc:
            if "Read timed out" not in str(exc):
                raise StoreError(f"etcd at {self.url}: watching {prefix} failed: {exc}") from None
        except (requests.RequestException, _Transient, ValueError, KeyError) as exc:
            raise StoreError(f"etcd at {self.url}: watching {prefix} failed: {exc}") from None

    def another(self) -> EtcdKV:
        """The same cluster on a connection of its own, presenting this one's token (no new authentication:
        etcd 3.4 holds its write lock while it checks a password with bcrypt; many at once stall writes for
        seconds)."""
        return EtcdKV(self.url, self._timeout, self._credentials, self._login)

    @property
    def authentications(self) -> int:
        """How many times this connection's login has authenticated (0: none; auth is off)."""
        return self._login.count if self._login is not None else 0

    def enable_auth(self, job_id: str, root_password: str, password: str) -> None:
        """On a cluster this job owns (`--store etcd`): a root user, a user and role for the job
        that may read and write only ``taiji/<job>/``, and auth on."""
        user = f"taiji-{job_id}"
        for path, payload in (
            ("/auth/user/add", {"name": "root", "password": root_password}),
            ("/auth/user/grant", {"user": "root", "role": "root"}),
            ("/auth/role/add", {"name": user}),
            (
                "/auth/role/grant",
                {"name": user, "perm": {"permType": "READWRITE", **_scan(f"taiji/{job_id}/")}},
            ),
            ("/auth/user/add", {"name": user, "password": password}),
            ("/auth/user/grant", {"user": user, "role": user}),
            ("/auth/enable", {}),
        ):
            self._post(path, payload)

    def close(self) -> None:
        for client in self._clients:
            client.session.close()
