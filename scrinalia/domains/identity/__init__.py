"""Identity: users (argon2id passwords, roles), sessions (only a token's SHA-256 is stored), login
protection (a per-process rate limit per address, and a durable lockout whose attempts are claimed
before the password is checked: per account, known or not, and per device cookie; docs/security.md).

Roles: ADMIN may OPERATE (enqueue, cancel, drain, settings, schedules); CURATOR and VIEWER read the
system screens. The archive's own curation rights belong to CURATOR and are not part of this API.
"""
