"""What went wrong talking to Redis, said by its cause with the fix: credentials refused, no
user given to a Redis that wants one, a user without the right, TLS refused, nothing reachable
at the address, a read-only replica. Every command says it the same way (`describe`).

    try:
        store.ping()
    except redis.RedisError as exc:
        print(describe(exc, url, needs="the submitter user"))
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import urlsplit

import redis

from .redis_address import redacted, redis_user, sentinel_address

SECURITY_DOC = "docs/security.md"
ADDRESS_FIX = "Set EDGETRAIN_REDIS_URL (or --redis-url) to the cluster's Redis"


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or while handling, outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _credentials(url: str) -> tuple[str | None, bool]:
    """(the user the URL logs in as, whether it gives a password)."""
    address = sentinel_address(url)
    if address is not None:
        return address.username, address.password is not None
    parts = urlsplit(url)
    return redis_user(url), bool(parts.password) or "password=" in parts.query


def _refused_login(url: str, where: str) -> str:
    user, password = _credentials(url)
    if user and password:
        return (f"{where} refused the password of user {user!r} (a wrong password, or no such user, or the user is off): "
                f"check that EDGETRAIN_REDIS_PASSWORD_FILE holds {user}'s password and that Redis loaded the ACL file made "
                "from the same passwords (`edgetrain redis-acl`)")  # fmt: skip
    if user:
        return (f"{where} wants a password for user {user!r} and none was given: set EDGETRAIN_REDIS_PASSWORD_FILE to the "
                f"absolute path of its password file ({user}.password)")  # fmt: skip
    given = "a password but no user" if password else "no user"
    return (f"{where} wants a user and a password (its default user is off) and the URL names {given}: set "
            "EDGETRAIN_REDIS_URL=redis://ROLE@HOST:PORT/DB (ROLE: worker for workers, submitter for the client, monitor for "
            "Flower, the exporter and doctor) and EDGETRAIN_REDIS_PASSWORD_FILE to that role's password file "
            f"({SECURITY_DOC})")  # fmt: skip


def _unreachable(exc: redis.RedisError, url: str, where: str) -> str:
    causes = _causes(exc)
    tls = urlsplit(url).scheme == "rediss"
    if verify := next((c for c in causes if isinstance(c, ssl.SSLCertVerificationError)), None):
        return (f"TLS refused: the certificate of {where} is not trusted ({verify.verify_message}): name the authority that issued "
                f"it with ssl_ca_certs=/path/to/ca.pem in EDGETRAIN_REDIS_URL, and connect by the name the certificate is "
                f"issued for ({SECURITY_DOC})")  # fmt: skip
    if tls and any(isinstance(c, ssl.SSLError | TimeoutError | socket.timeout) for c in causes[1:]):
        return (f"TLS refused: no TLS handshake with {where} ({causes[-1]}): if it does not speak TLS on that port, use "
                f"redis:// (or the port of its tls-port); {SECURITY_DOC}")  # fmt: skip
    if not tls and (any(isinstance(c, ConnectionResetError) for c in causes) or "closed by server" in str(exc)):
        return (f"{where} closed the connection without an answer ({exc}): if it accepts TLS only, use rediss:// with "
                f"ssl_ca_certs ({SECURITY_DOC})")  # fmt: skip
    return f"cannot reach {where}: {str(exc).rstrip('.')}. Is it running, and is that its address? {ADDRESS_FIX}"


# How Redis refuses a script's command on a key the user may not touch (an error reply that
# redis-py does not raise as NoPermissionError)
SCRIPT_REFUSED = "The user executing the script can't access"


def describe(exc: redis.RedisError, url: str, needs: str) -> str:
    """What `exc`, raised using Redis at `url`, means and how to fix it; `needs`: which
    Redis user the command needs (for a refused command)."""
    where = f"Redis at {redacted(url)}"
    if isinstance(exc, redis.AuthenticationError) or "NOAUTH" in str(exc):
        return _refused_login(url, where)
    if isinstance(exc, redis.exceptions.NoPermissionError) or SCRIPT_REFUSED in str(exc):
        user = redis_user(url) or "default"
        return (f"{where} refused user {user!r} this command ({exc}): this command needs {needs}: set "
                "EDGETRAIN_REDIS_URL to redis://ROLE@HOST:PORT/DB with EDGETRAIN_REDIS_PASSWORD_FILE naming that role's "
                f"password file ({SECURITY_DOC})")  # fmt: skip
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return (f"{where} is a read-only replica, and edgetrain writes: set EDGETRAIN_REDIS_URL to its master (or to the "
                "sentinels that follow the master: sentinel://HOST:PORT,.../MASTER_NAME/DB)")  # fmt: skip
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return _unreachable(exc, url, where)
    return f"{where} answered with an error: {exc}"
