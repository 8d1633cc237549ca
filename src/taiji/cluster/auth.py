"""The job secret and the signatures on control records (docs/design.md#security).

A job has one secret: 32 random bytes in a 0600 file in the launcher's job directory, handed
to agents by ``--secret-file`` (never on a command line: argv is visible to every user in
``ps``) and to workers in their environment (same user). Keys for each use are derived from it,
so one leaked derived key does not give the others: ``sign`` (control records in the store),
``p2p`` (the model store of decoupled strategies).

A sealed record is JSON ``{"record": {...}, "mac": hex}`` with the MAC over the record's
canonical JSON and the store key it is written under, so a record cannot be replayed under
another key (a registration moved to another host's slot, a command to another agent).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from ..errors import AuthError, ConfigError

SECRET_BYTES = 32


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def derive(secret: bytes, label: str) -> bytes:
    """The key for one use of the job secret (``sign``, ``p2p``, ``etcd``)."""
    return hmac.new(secret, b"taiji/" + label.encode(), hashlib.sha256).digest()


def write_secret_file(path: Path, secret: bytes) -> Path:
    """Write ``secret`` (hex) to ``path``, readable by this user only, created so from the start."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, secret.hex().encode() + b"\n")
    finally:
        os.close(fd)
    os.chmod(path, 0o600)  # an existing file keeps its mode on O_CREAT
    return path


def parse_secret(text: str, source: str) -> bytes:
    raw = text.strip()
    try:
        secret = bytes.fromhex(raw)
    except ValueError:
        raise ConfigError(
            f"{source} does not hold a taiji job secret (expected {2 * SECRET_BYTES} hex "
            "digits, as `taiji run` writes)"
        ) from None
    if len(secret) != SECRET_BYTES:
        raise ConfigError(
            f"{source} holds {len(secret)} bytes; a taiji job secret has {SECRET_BYTES} "
            "(copy the file `taiji run` printed, unchanged)"
        )
    return secret


def read_secret_file(path: str, stdin=None) -> bytes:
    """The secret from ``path``, or from standard input when ``path`` is ``-``. A file others can
    read is refused: the secret is the job's only credential."""
    if path == "-":
        import sys

        return parse_secret((stdin or sys.stdin).readline(), "standard input")
    file = Path(path)
    try:
        mode = file.stat().st_mode
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the secret file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"the secret file {path} is not a taiji job secret (it is not text); copy the "
            "file `taiji run` printed, unchanged"
        ) from None
    if mode & 0o077:
        raise ConfigError(
            f"the secret file {path} is readable by other users (mode {mode & 0o777:o}); "
            f"run `chmod 600 {path}`"
        )
    return parse_secret(text, f"the secret file {path}")


def secret_from_env() -> bytes | None:
    """The job secret the launcher or agent put in this worker's environment (None: not launched)."""
    from .. import env

    raw = env.SECRET.get()
    return parse_secret(raw, f"environment variable {env.SECRET.name}") if raw else None


def p2p_key() -> bytes:
    """This job's key for the p2p model store (empty when not launched: loopback only)."""
    secret = secret_from_env()
    return derive(secret, "p2p") if secret is not None else b""


def _canonical(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


class Signer:
    """Seals and opens control records with the job's ``sign`` key."""

    def __init__(self, secret: bytes):
        self._key = derive(secret, "sign")

    def _mac(self, key: str, body: bytes) -> str:
        return hmac.new(self._key, key.encode() + b"\0" + body, hashlib.sha256).hexdigest()

    def seal(self, key: str, record: dict) -> bytes:
        body = _canonical(record)
        return json.dumps(
            {"record": record, "mac": self._mac(key, body)}, sort_keys=True, separators=(",", ":")
        ).encode()

    def open(self, key: str, raw: bytes | str) -> dict:
        """The record sealed under ``key``; AuthError if it was not sealed with this job's secret."""
        try:
            sealed = json.loads(raw)
            record, mac = sealed["record"], sealed["mac"]
        except (ValueError, KeyError, TypeError):
            raise AuthError(f"record {key} is not a signed taiji record") from None
        if (
            not isinstance(record, dict)
            or not isinstance(mac, str)
            or not hmac.compare_digest(mac, self._mac(key, _canonical(record)))
        ):
            raise AuthError(f"record {key} has a bad signature: it was not written with this job's secret")
        return record


def unsealed(raw: bytes | str) -> dict:
    """A record's content without checking its signature, for readers that hold no secret
    (in-process test stores); plain JSON records pass through."""
    data = json.loads(raw)
    if isinstance(data, dict) and set(data) == {"record", "mac"}:
        return data["record"]
    return data
