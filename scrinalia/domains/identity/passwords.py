"""Password hashing with argon2id (argon2-cffi) and the password policy.

The hash carries its own parameters, so a hash made with other costs (older defaults, the tests'
cheap profile) still verifies; ``needs_rehash`` upgrades it at the next successful login.
"""
from __future__ import annotations

from functools import lru_cache

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from scrinalia.domains.identity.errors import InvalidUserInput

PASSWORD_MAX_LENGTH = 1024  # argon2 takes any length; a bound keeps a login from being a CPU sink


def default_hasher() -> PasswordHasher:
    """RFC 9106's second recommended profile, with a modest parallelism for a small server."""
    return PasswordHasher(time_cost=3, memory_cost=64 * 1024, parallelism=2, hash_len=32, salt_len=16, type=Type.ID)


def cheap_hasher() -> PasswordHasher:
    """For tests only: still argon2id, at the lowest cost."""
    return PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1, hash_len=32, salt_len=16, type=Type.ID)


@lru_cache(maxsize=1)
def _shared_default() -> PasswordHasher:
    return default_hasher()


def hash_password(password: str, hasher: PasswordHasher | None = None) -> str:
    return (hasher or _shared_default()).hash(password)


def verify_password(password_hash: str, password: str, hasher: PasswordHasher | None = None) -> bool:
    if len(password) > PASSWORD_MAX_LENGTH:
        return False
    try:
        return (hasher or _shared_default()).verify(password_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def needs_rehash(password_hash: str, hasher: PasswordHasher | None = None) -> bool:
    try:
        return (hasher or _shared_default()).check_needs_rehash(password_hash)
    except (InvalidHashError, ValueError):
        return True


def _profile(hasher: PasswordHasher) -> tuple:
    return (hasher.time_cost, hasher.memory_cost, hasher.parallelism, hasher.hash_len, hasher.salt_len, hasher.type)


@lru_cache(maxsize=8)
def _dummy_hash(profile: tuple) -> str:
    time_cost, memory_cost, parallelism, hash_len, salt_len, kind = profile
    hasher = PasswordHasher(time_cost=time_cost, memory_cost=memory_cost, parallelism=parallelism,
                            hash_len=hash_len, salt_len=salt_len, type=kind)
    return hasher.hash("scrinalia: equalise the time of an unknown email")


def burn_verify_time(password: object, hasher: PasswordHasher | None = None) -> None:
    """Spend what a real verification costs with the same profile, so an unknown email is not told
    apart by timing."""
    chosen = hasher or _shared_default()
    verify_password(_dummy_hash(_profile(chosen)), password if isinstance(password, str) else "", chosen)


def check_password_policy(password: object, *, min_length: int = 12, email: str | None = None,
                          field: str = "password") -> str:
    if not isinstance(password, str):
        raise InvalidUserInput(field, "must be a string")
    if len(password) < min_length:
        raise InvalidUserInput(field, f"must be at least {min_length} characters")
    if len(password) > PASSWORD_MAX_LENGTH:
        raise InvalidUserInput(field, f"must be at most {PASSWORD_MAX_LENGTH} characters")
    if not password.strip():
        raise InvalidUserInput(field, "must not be blank")
    if email and password.strip().lower() == email.strip().lower():
        raise InvalidUserInput(field, "must not be the email address")
    return password
