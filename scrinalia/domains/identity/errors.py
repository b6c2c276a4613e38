"""Typed identity errors. Messages never contain a password, a hash or a token."""
from __future__ import annotations


class IdentityError(Exception):
    pass


class InvalidCredentials(IdentityError):
    """Unknown email, wrong password or inactive account: deliberately indistinguishable."""

    def __init__(self) -> None:
        super().__init__("invalid email or password")


class AccountLocked(IdentityError):
    def __init__(self, retry_after_seconds: float) -> None:
        super().__init__("the account is temporarily locked after repeated failed logins")
        self.retry_after_seconds = max(1, int(retry_after_seconds + 0.999))


class InvalidUserInput(IdentityError, ValueError):
    """A field is unacceptable (email, role, password policy); ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UserExists(IdentityError):
    def __init__(self, email: str) -> None:
        super().__init__(f"a user with the email {email!r} already exists")
        self.email = email


class UserNotFound(IdentityError, LookupError):
    def __init__(self, who: object) -> None:
        super().__init__(f"no user {who}")
