"""The dashboard's protections: signed double-submit CSRF tokens, HTTP basic
auth, and the loopback rule (see :mod:`jobkeeper.dashboard.app`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Mapping
from typing import Any

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from jobkeeper.errors import ConfigError

#: Environment variable holding the dashboard's basic-auth password.
PASSWORD_ENV = "JOBKEEPER_DASHBOARD_PASSWORD"
#: The basic-auth user name.
USER = "jobkeeper"
CSRF_COOKIE = "jobkeeper_csrf"
CSRF_FIELD = "csrf_token"


def dashboard_password(password: str | None = None) -> str | None:
    """The basic-auth password: ``password``, else ``$JOBKEEPER_DASHBOARD_PASSWORD``.

    Returns:
        The password, or None for none: ``password=""`` (the variable is
        then not read), or neither given, or the variable empty (no basic
        auth).

    Raises:
        ConfigError: the password is blank (only whitespace): a variable set
            by mistake (``=" "``) would otherwise guard a dashboard served
            on every address with a password anyone can guess.
    """
    source = "password"
    if password == "":
        return None  # none, whatever the variable says: how callers turn it off
    if password is None:
        password = os.environ.get(PASSWORD_ENV) or None
        source = f"${PASSWORD_ENV}"
    if password is not None and not password.strip():
        raise ConfigError(
            f"{source} is blank (only whitespace): set a real password, or unset it "
            "(the dashboard then listens on loopback addresses only, without basic auth)"
        )
    return password


#: Seconds a signed flash message is shown after its action (a reload
#: within them shows it again).
FLASH_TTL = 60


class Csrf:
    """Signed double-submit tokens (see :mod:`jobkeeper.dashboard.app`)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def new_token(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign(nonce)}"

    def _sign(self, text: str) -> str:
        return hmac.new(self._secret, _raw(text), hashlib.sha256).hexdigest()

    def flash_params(self, path: str, message: str, now: float) -> dict[str, str]:
        """The query parameters that carry ``message`` to the page at
        ``path`` after an action (post/redirect/get), signed with the page
        and the time: a link of anyone's making showed any text in the banner
        that says what an action did, and a signed message alone could be
        shown on any page, or long after it stopped being true (break-tests
        73 and 74).
        """
        at = str(int(now))
        return {"flash": message, "flash_at": at, "flash_sig": self._flash_sign(path, at, message)}

    def flash_message(self, path: str, query: Mapping[str, str], now: float) -> str | None:
        """The message of ``query`` when this dashboard signed it for
        ``path`` within the last ``FLASH_TTL`` seconds, else None.
        """
        message, at, signature = (query.get(k) for k in ("flash", "flash_at", "flash_sig"))
        if message is None or at is None or signature is None or not at.isdigit():
            return None
        if not 0 <= now - int(at) <= FLASH_TTL:
            return None
        expected = self._flash_sign(path, at, message)
        return message if hmac.compare_digest(_raw(signature), _raw(expected)) else None

    def _flash_sign(self, path: str, at: str, message: str) -> str:
        # NUL-separated and prefixed: never a CSRF nonce (URL-safe base64),
        # so neither signature passes for the other.
        return self._sign(f"flash\0{path}\0{at}\0{message}")

    def valid(self, cookie: str | None, field: str | None) -> bool:
        # Bytes: compare_digest refuses str holding anything but ASCII, and
        # a forged token may hold anything.
        if not cookie or not field or not hmac.compare_digest(_raw(cookie), _raw(field)):
            return False
        nonce, _, signature = cookie.partition(".")
        return bool(nonce) and hmac.compare_digest(_raw(signature), _raw(self._sign(nonce)))


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class BasicAuth(BaseHTTPMiddleware):
    """Every request needs ``jobkeeper:<password>`` (constant-time compare)."""

    def __init__(self, app: Any, password: str) -> None:
        super().__init__(app)
        self._expected = base64.b64encode(f"{USER}:{password}".encode()).decode()

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "basic" and hmac.compare_digest(
            credentials.strip().encode(), self._expected.encode()
        ):
            return await call_next(request)
        return PlainTextResponse(
            "authentication required\n",
            status_code=401,
            headers={"WWW-Authenticate": 'Basic realm="jobkeeper", charset="UTF-8"'},
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
