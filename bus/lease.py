"""Leases with a TTL in a NATS JetStream key-value bucket, fenced by the KV revision.

API (stable; other modules build on it):

    await ensure_lease_bucket(js, bucket, replicas=1)     # admin only: create the bucket
    leases = await LeaseBucket.open(js, bucket, ttl=5)    # ttl: whole seconds, >= 1
    leases.scope                                          # names the token sequence
    lease = await leases.try_acquire(key, holder)         # Lease | None (held by another)
    lease = await leases.acquire(key, holder, stop=ev)    # waits; None once `stop` is set
    lease = await leases.renew(lease)                     # new Lease; raises LeaseLost
    await leases.release(lease)                           # False if it was no longer ours
    await leases.current(key)                             # Lease | None
    async with leases.held(key, holder, stop=ev) as h:    # acquire, renew every ttl/3,
        h.token; h.lost (asyncio.Event); h.check()        # release on exit
    leases.held(key, holder, wait=False)                  # LeaseError if held by another

    Lease(key, holder, token, revision, ttl, valid_until)
    LeaseError > LeaseLost, AcquireStopped
    RECORDER_LEASES, DEVICE_LEASES                        # the buckets the hub creates
    lease_subjects(bucket, keys)                          # what a user needs to use some

- acquire is a KV create (refused while the key exists); renew is an update on the last
  revision (compare-and-set); release is a delete on that revision.
- Expiry is server-side: every write carries a per-message TTL (`Nats-TTL`, whole seconds,
  nats-server >= 2.11), so the clocks of different hosts never matter. A holder counts
  its lease valid until `ttl` after it *sent* its last successful write (local monotonic
  clock), which is never later than the server's expiry.
- A key still held by an earlier incarnation of the same holder (a process killed and
  started again) is held all the same: the new one waits for it to expire.
- The fencing token is the KV revision at acquire: the stream sequence, so strictly
  increasing across holders. Whatever the lease guards must refuse a write whose token
  is older than one it has already seen (see eventstore/duckdb_store.py).
- In a JetStream domain (a client of a leaf node, `jetstream(domain=...)`), writes go to
  `$JS.<domain>.API.$KV.<bucket>.<key>`: nats-server denies `$KV.>` across a leaf
  connection, and the domain's hub stores such a write as `$KV.<bucket>.<key>`.
- A holder whose renewal fails (the key is gone or was taken: compare-and-set mismatch;
  or no renewal got through for a whole TTL) sees `lost` set, and must stop the guarded
  work: `check()` raises LeaseLost from then on.
- `scope` (`<bucket>@<creation time>`): a bucket made again starts its revisions over,
  under a new scope; tokens of different scopes are never compared.
- The hub's admin creates both buckets, as replicated as KF_EVENTS; others only open them.
- The bucket bounds every write's life too (`max_age`, `MAX_LEASE_AGE`: 60 s): a key
  written without a `Nats-TTL` (by a user with a lease bucket's permissions, but not this
  code) is gone within that, so no write can squat a key for ever. A lease's own TTL
  must be shorter (renewals rewrite the key every ttl/3). A bucket made before this
  rule gets the bound when the admin next ensures it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import anyio
import msgspec
import structlog
from nats.js import JetStreamContext
from nats.js.api import DEFAULT_PREFIX, KeyValueConfig, StorageType
from nats.js.errors import APIError, BadRequestError, NotFoundError
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE

log = structlog.get_logger("bus.lease")

#: The bucket of the recording hub's single lease.
RECORDER_LEASES = "KF_RECORDER_LEASE"
#: The bucket of device leases (a host's CPU cores, a GPU), held by benchmarkers.
DEVICE_LEASES = "KF_DEVICE_LEASES"

#: Seconds any write to a lease bucket lives at most, whatever its own TTL said.
MAX_LEASE_AGE = 60.0

_WRONG_LAST_SEQUENCE = (10071, 10164)
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_TTL = "Nats-TTL"


class LeaseError(Exception):
    """A lease bucket or key that cannot be used."""


class LeaseLost(LeaseError):
    """The lease expired or another holder took it: stop the guarded work."""


class AcquireStopped(LeaseError):
    """The stop flag was set while waiting for a lease."""


@dataclass(frozen=True)
class Lease:
    key: str
    holder: str
    #: The KV revision at acquire: strictly increasing across holders of the bucket.
    token: int
    #: The KV revision of the latest write (acquire or renew).
    revision: int
    ttl: int
    #: Local monotonic time until which the holder may count on the lease.
    valid_until: float = field(compare=False)

    def expired(self) -> bool:
        return time.monotonic() >= self.valid_until


class _Value(msgspec.Struct, frozen=True):
    holder: str
    #: 0 on the acquiring write, whose own revision is the token.
    token: int = 0


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(_Value).decode


def kv_stream(bucket: str) -> str:
    return f"KV_{bucket}"


def lease_subjects(bucket: str, keys: Sequence[str] = (">",)) -> list[str]:
    """What a user must be allowed to publish to use the leases of `bucket` whose keys
    match `keys` (subject patterns; every key by default): the server refuses its writes,
    renewals and releases of any other key, whatever the client sends."""
    stream = kv_stream(bucket)
    return [
        *(f"$KV.{bucket}.{key}" for key in keys),
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
    ]


async def ensure_lease_bucket(
    js: JetStreamContext,
    bucket: str,
    *,
    replicas: int = 1,
    storage: StorageType | None = None,
    max_age: float = MAX_LEASE_AGE,
) -> None:
    """Create `bucket` (one revision per key, per-message TTLs allowed, no write older
    than `max_age` s) unless it exists; bound an existing one's writes the same way."""
    try:
        info = await js.stream_info(kv_stream(bucket))
    except NotFoundError:
        try:
            await js.create_key_value(
                KeyValueConfig(
                    bucket=bucket, history=1, replicas=replicas, storage=storage, ttl=max_age
                )
            )
        except BadRequestError:  # created concurrently by another process
            await js.stream_info(kv_stream(bucket))
        except TimeoutError as exc:  # the server drops what a user may not do
            raise LeaseError(
                f"could not create the lease bucket {bucket}: this user may not "
                "(start the hub once with admin credentials)"
            ) from exc
        return
    if not info.config.allow_msg_ttl:
        raise LeaseError(
            f"the bucket {bucket} exists but does not allow per-message TTLs; "
            f"delete it (nats kv del {bucket}) and start the hub again"
        )
    if not info.config.max_age or info.config.max_age > max_age:
        try:
            window = min(info.config.duplicate_window or max_age, max_age)
            await js.update_stream(replace(info.config, max_age=max_age, duplicate_window=window))
        except (TimeoutError, APIError) as exc:  # not the admin: it bounds it later
            log.warning("could not bound the lease bucket's writes", bucket=bucket, error=str(exc))


class LeaseBucket:
    def __init__(self, js: JetStreamContext, bucket: str, ttl: int, scope: str = "") -> None:
        self.js = js
        self.bucket = bucket
        self.ttl = ttl
        #: Names this bucket's token sequence: a bucket deleted and made again starts its
        #: revisions (tokens) over, under a new scope.
        self.scope = scope or bucket
        self._stream = kv_stream(bucket)
        api = js._prefix  # "$JS.API", or "$JS.<domain>.API" in a JetStream domain
        self._write_prefix = "" if api == DEFAULT_PREFIX else f"{api}."

    @classmethod
    async def open(
        cls, js: JetStreamContext, bucket: str, ttl: float, *, wait: bool = False
    ) -> LeaseBucket:
        """The leases of an existing `bucket` (see ensure_lease_bucket), each `ttl` s long;
        `wait`: until the hub has created it (an actor may start before the hub), saying
        so every 30 s, else LeaseError at once."""
        if ttl < 1 or ttl != math.floor(ttl) or ttl >= MAX_LEASE_AGE:
            raise LeaseError(
                f"a lease TTL is a whole number of seconds >= 1 and < {MAX_LEASE_AGE:g}, not {ttl}"
            )
        said = -math.inf
        while True:
            try:
                info = await js.stream_info(kv_stream(bucket))
                break
            except NotFoundError as exc:
                if not wait:
                    raise LeaseError(f"no lease bucket {bucket} (the hub creates it)") from exc
            if time.monotonic() - said >= 30:
                said = time.monotonic()
                log.info("waiting for the hub to create the lease bucket", bucket=bucket)
            await asyncio.sleep(0.25)
        if not info.config.allow_msg_ttl:
            raise LeaseError(f"the bucket {bucket} does not allow per-message TTLs")
        created = info.created.isoformat() if info.created else ""
        return cls(js, bucket, int(ttl), f"{bucket}@{created}")

    def _subject(self, key: str) -> str:
        if not key or any(c not in _KEY_CHARS for c in key) or key[0] == "." or key[-1] == ".":
            raise LeaseError(f"invalid lease key {key!r}: letters, digits and -/_=. only")
        return f"$KV.{self.bucket}.{key}"

    def _write_subject(self, key: str) -> str:
        return self._write_prefix + self._subject(key)

    async def _write(self, key: str, value: _Value, last: int) -> tuple[int, float]:
        """Write on revision `last` (0: none); the new revision and when it was sent."""
        sent = time.monotonic()
        ack = await self.js.publish(
            self._write_subject(key),
            _encode(value),
            headers={_EXPECTED_LAST: str(last), _TTL: str(self.ttl)},
        )
        return ack.seq, sent

    async def _latest(self, key: str) -> tuple[int, _Value | None] | None:
        """The key's last revision and its value (None: a release marker); None if no
        revision is left (never written, or expired)."""
        try:
            msg = await self.js.get_msg(self._stream, subject=self._subject(key))
        except NotFoundError:
            return None
        revision = msg.seq or 0
        if msg.headers and msg.headers.get(KV_OP) in (KV_DEL, KV_PURGE):
            return revision, None
        try:
            return revision, _decode(msg.data or b"")
        except msgspec.DecodeError:
            return revision, _Value(holder="?")

    async def try_acquire(self, key: str, holder: str) -> Lease | None:
        """The lease on `key` for `holder`, or None while another (or an earlier
        incarnation of the same holder) holds it."""
        try:
            revision, sent = await self._write(key, _Value(holder), 0)
        except APIError as exc:
            if exc.err_code not in _WRONG_LAST_SEQUENCE:
                raise
            latest = await self._latest(key)
            if latest is None or latest[1] is not None:
                return None  # held (or just expired: the next try takes it)
            try:  # released: a delete marker is the key's last revision
                revision, sent = await self._write(key, _Value(holder), latest[0])
            except APIError as again:
                if again.err_code in _WRONG_LAST_SEQUENCE:
                    return None
                raise
        return Lease(key, holder, revision, revision, self.ttl, sent + self.ttl)

    async def acquire(
        self, key: str, holder: str, *, stop: asyncio.Event | None = None
    ) -> Lease | None:
        """Wait for the lease on `key` (None once `stop` is set)."""
        poll = min(max(self.ttl / 10, 0.1), 1.0)
        while stop is None or not stop.is_set():
            lease = await self.try_acquire(key, holder)
            if lease is not None:
                return lease
            if stop is None:
                await asyncio.sleep(poll)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll):
                        await stop.wait()
        return None

    async def renew(self, lease: Lease) -> Lease:
        """Extend `lease` by a TTL; raises LeaseLost if it expired or was taken."""
        try:
            revision, sent = await self._write(
                lease.key, _Value(lease.holder, lease.token), lease.revision
            )
        except APIError as exc:
            if exc.err_code in _WRONG_LAST_SEQUENCE:
                raise LeaseLost(
                    f"lease {self.bucket}/{lease.key} (token {lease.token}) was lost: "
                    "it expired or another holder took it"
                ) from exc
            raise
        return replace(lease, revision=revision, valid_until=sent + self.ttl)

    async def release(self, lease: Lease) -> bool:
        """Give `lease` up at once; False if it was no longer ours."""
        try:
            await self.js.publish(
                self._write_subject(lease.key),
                # the marker expires too, so released keys (one per process that ever
                # took a share) do not pile up in the bucket
                headers={KV_OP: KV_DEL, _EXPECTED_LAST: str(lease.revision), _TTL: str(self.ttl)},
            )
        except APIError as exc:
            if exc.err_code in _WRONG_LAST_SEQUENCE:
                return False
            raise
        return True

    async def current(self, key: str) -> Lease | None:
        """Who holds `key` now (valid_until is unknown to a non-holder: 0)."""
        latest = await self._latest(key)
        if latest is None:
            return None
        revision, value = latest
        if value is None:
            return None
        return Lease(key, value.holder, value.token or revision, revision, self.ttl, 0.0)

    def held(
        self, key: str, holder: str, *, stop: asyncio.Event | None = None, wait: bool = True
    ) -> HeldLease:
        """Hold `key` for an `async with` block: acquire (waiting unless `wait` is False:
        then raise LeaseError if another holds it; AcquireStopped once `stop` is set),
        renew every ttl/3 in a task of its own, release on exit. Watch `lost` or call
        `check()`."""
        return HeldLease(self, key, holder, stop=stop, wait=wait)


_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-/_=.")


class HeldLease:
    """A lease held for an `async with` block (`LeaseBucket.held`). It is a plain object,
    not an async generator, so the task that enters it and the task that leaves it may
    differ (a timed window is opened and closed from a worker thread) and nothing is left
    for the event loop to finalise. Renewal is a task of its own whose loop runs in an
    anyio `CancelScope`: leaving the block cancels the scope, and every await in it raises
    from then on, so no renewal can swallow the cancel and renew for ever (its timeouts
    are `asyncio.timeout` blocks: Python 3.11's `asyncio.wait_for` loses a cancellation
    that arrives as its awaitable completes)."""

    def __init__(
        self,
        bucket: LeaseBucket,
        key: str,
        holder: str,
        *,
        stop: asyncio.Event | None = None,
        wait: bool = True,
    ) -> None:
        self.bucket = bucket
        self.lease = Lease(key, holder, 0, 0, bucket.ttl, 0.0)
        self.lost = asyncio.Event()
        self.reason = ""
        self._stop = stop
        self._wait = wait
        self._renewal = anyio.CancelScope()
        self._renewing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HeldLease:
        key, holder = self.lease.key, self.lease.holder
        if self._wait:
            lease = await self.bucket.acquire(key, holder, stop=self._stop)
            if lease is None:
                raise AcquireStopped(f"stopped while waiting for {self.bucket.bucket}/{key}")
        else:
            lease = await self.bucket.try_acquire(key, holder)
            if lease is None:
                other = await self.bucket.current(key)
                by = other.holder if other else "another"
                raise LeaseError(f"{self.bucket.bucket}/{key} is held by {by}")
        self.lease = lease
        self._renewing = asyncio.create_task(self._renew_until_stopped())
        return self

    async def __aexit__(self, *_: object) -> None:
        """Stop the renewal and give the lease back (2 s at most). A cancel of the task
        leaving the block still goes through, once the lease is given back."""
        self._renewal.cancel()
        try:
            if self._renewing is not None:
                await asyncio.wait({self._renewing})
        finally:
            if not self.lost.is_set():
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2.0):
                        await self.bucket.release(self.lease)

    @property
    def token(self) -> int:
        return self.lease.token

    def check(self) -> None:
        """Raise LeaseLost if the lease is lost (or may have expired)."""
        if not self.lost.is_set() and self.lease.expired():
            self._lose("no renewal got through within the TTL")
        if self.lost.is_set():
            raise LeaseLost(self.reason)

    def _lose(self, reason: str) -> None:
        self.reason = f"lease {self.bucket.bucket}/{self.lease.key} lost: {reason}"
        self.lost.set()
        log.warning(
            "lease lost", key=self.lease.key, holder=self.lease.holder, token=self.token, why=reason
        )

    async def _renew_until_stopped(self) -> None:
        with self._renewal:
            await self._renew_until_lost()

    async def _renew_until_lost(self) -> None:
        every = self.bucket.ttl / 3
        while True:
            await asyncio.sleep(every if not self.lease.expired() else 0)
            if self.lease.expired():
                self._lose("no renewal got through within the TTL")
                return
            try:
                async with asyncio.timeout(self.lease.valid_until - time.monotonic()):
                    self.lease = await self.bucket.renew(self.lease)
            except LeaseLost as exc:
                self._lose(str(exc))
                return
            except Exception as exc:  # the bus is down for now: try again until the TTL
                log.info("lease renewal failed; retrying", key=self.lease.key, error=str(exc))
                every = min(every, 0.25)
            else:
                every = self.bucket.ttl / 3
