"""The login lockout: a bucket of attempts claimed atomically BEFORE a password is checked.

A bucket is an account (the SHA-256 of the normalised e-mail, whether a user has it or not, so an unknown
address is counted, locked and answered exactly like a known one) or a trusted device (the SHA-256 of a
device cookie that a browser got from an earlier successful login of that user: its own bucket, so an
attacker who locks the account does not lock out the user's own browser; OWASP's device cookies).

``claim`` is ONE statement (an upsert whose row lock serialises concurrent claims in every API process):
the first ``threshold`` claims of a series are granted and may check a password; the claim that reaches
the threshold also sets the lock, for ``base x 2^lockout_count`` seconds (capped); while locked every
claim is refused without a password being checked. When the lock ends a new series starts and the next
lock is twice as long. A successful login deletes its bucket. So at most ``threshold`` passwords are
checked per bucket and lock period, whatever the concurrency.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Connection, Engine, text

BucketScope = Literal["account", "device"]


@dataclass(frozen=True, slots=True)
class LockoutPolicy:
    threshold: int = 5
    base_seconds: float = 60.0
    max_seconds: float = 86_400.0


@dataclass(frozen=True, slots=True)
class Bucket:
    scope: BucketScope
    key_sha256: str

    @classmethod
    def account(cls, normalized_email: str) -> Bucket:
        return cls("account", hashlib.sha256(normalized_email.encode("utf-8")).hexdigest())

    @classmethod
    def device(cls, device_token_sha256: str) -> Bucket:
        return cls("device", device_token_sha256)


@dataclass(frozen=True, slots=True)
class Claim:
    granted: bool  # this attempt may check a password
    locked_for: float | None  # seconds the bucket stays locked (set by this claim or an earlier one)


# The new series' count when the bucket is not locked: a series that reached the threshold (its lock has
# ended) starts over at 1.
_NEXT = "(CASE WHEN t.attempts >= :n THEN 1 ELSE t.attempts + 1 END)"
_LOCK = ("now() + make_interval(secs => LEAST(CAST(:max_s AS double precision), "
         "CAST(:base_s AS double precision) * power(2, LEAST({count}, 40))))")

_CLAIM = text(
    f"""
    INSERT INTO auth_login_throttle AS t (scope, key_sha256, attempts, lockout_count, locked_until)
    VALUES (:scope, :key, 1, CASE WHEN 1 >= :n THEN 1 ELSE 0 END,
            CASE WHEN 1 >= :n THEN {_LOCK.format(count='0')} END)
    ON CONFLICT (scope, key_sha256) DO UPDATE SET
        attempts      = CASE WHEN t.locked_until > now() THEN :n + 1 ELSE {_NEXT} END,
        lockout_count = CASE WHEN t.locked_until > now() OR {_NEXT} < :n THEN t.lockout_count
                             ELSE t.lockout_count + 1 END,
        locked_until  = CASE WHEN t.locked_until > now() OR {_NEXT} < :n THEN t.locked_until
                             ELSE {_LOCK.format(count='t.lockout_count')} END,
        updated_at    = now()
    RETURNING attempts <= :n AS granted,
              CASE WHEN locked_until > now() THEN extract(epoch FROM locked_until - now()) END AS locked_for
    """
)

_RELEASE = text("DELETE FROM auth_login_throttle WHERE scope = :scope AND key_sha256 = :key")

# A bucket idle for longer than the longest lock, and not locked, holds nothing worth keeping.
_PRUNE = text(
    """DELETE FROM auth_login_throttle
        WHERE updated_at < now() - make_interval(secs => CAST(:idle_s AS double precision))
          AND (locked_until IS NULL OR locked_until <= now())"""
)


def claim(engine: Engine, bucket: Bucket, policy: LockoutPolicy) -> Claim:
    """Claim one attempt of ``bucket``: granted or refused, and the lock it is under."""
    with engine.begin() as conn:
        row = conn.execute(
            _CLAIM,
            {"scope": bucket.scope, "key": bucket.key_sha256, "n": policy.threshold,
             "base_s": float(policy.base_seconds), "max_s": float(policy.max_seconds)},
        ).one()
    return Claim(bool(row.granted), float(row.locked_for) if row.locked_for is not None else None)


def release(conn: Connection, bucket: Bucket) -> None:
    """A successful login: the bucket's series and its doubling are over."""
    conn.execute(_RELEASE, {"scope": bucket.scope, "key": bucket.key_sha256})


def clear_account(conn: Connection, normalized_email: str) -> None:
    """An administrator's password reset lifts the account's lock."""
    release(conn, Bucket.account(normalized_email))


class Pruner:
    """Deletes idle buckets every ``every`` claims of this process, so sprayed unknown e-mails do not
    accumulate (bounded anyway by the per-address rate limit)."""

    def __init__(self, every: int = 256) -> None:
        self.every = every
        self._count = 0
        self._lock = threading.Lock()

    def tick(self, engine: Engine, policy: LockoutPolicy) -> None:
        with self._lock:
            self._count += 1
            due = self._count % self.every == 0
        if due:
            with engine.begin() as conn:
                conn.execute(_PRUNE, {"idle_s": float(max(policy.max_seconds, policy.base_seconds)) * 2})
