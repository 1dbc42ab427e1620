"""The dashboard's protections: signed double-submit CSRF tokens, HTTP basic
auth, and the loopback rule (see :mod:`jobkeeper.dashboard.app`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
from typing import Any

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

#: Environment variable holding the dashboard's basic-auth password.
PASSWORD_ENV = "JOBKEEPER_DASHBOARD_PASSWORD"
#: The basic-auth user name.
USER = "jobkeeper"
CSRF_COOKIE = "jobkeeper_csrf"
CSRF_FIELD = "csrf_token"


class Csrf:
    """Signed double-submit tokens (see :mod:`jobkeeper.dashboard.app`)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def new_token(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign(nonce)}"

    def _sign(self, text: str) -> str:
        return hmac.new(self._secret, _raw(text), hashlib.sha256).hexdigest()

    def sign(self, text: str) -> str:
        """The signature of ``text`` (a flash message in a redirect's URL)."""
        return self._sign(text)

    def signed(self, text: str | None, signature: str | None) -> bool:
        """Whether ``signature`` is this dashboard's of ``text``."""
        if text is None or signature is None:
            return False
        return hmac.compare_digest(_raw(signature), _raw(self._sign(text)))

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
