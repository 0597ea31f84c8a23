"""The secrets of this run, and the one place that hides them from anything written or printed.

A run has up to three kinds of secret: the API key read from the environment (``--api-key-env``), the password
(or bare user token) in ``--url``'s userinfo, and credential query parameters in ``--url`` (``?api_key=``,
``?key=``, ``?token=``...). Two rules keep them off disk and off the screen:

* **At entry**: ``split_url`` takes a ``--url`` apart into the base every component builds requests on (no
  userinfo, no query), the URL to record (credentials replaced by ``***``), and the credentials themselves,
  which only the signing transport holds (``endpoint.transport.SignedTransport``) and adds to each request.
* **At the points of recording**: server text can echo a secret back (a gateway that quotes the Authorization
  header in its 401 body), so the client passes each request's error message through ``redact`` where the
  record is made, and the CLI passes every error line it prints through it.

The registry is process-wide on purpose: the secrets come from the process's environment and arguments, and a
redactor handed from object to object would leak the first time one hand-off was missed. ``SECRETS.clear()``
resets it (tests).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlencode, urlsplit, urlunsplit

from agentload.errors import ConfigError

MASK = "***"

# Free-text search is only for secrets at least this long: a shorter value ("pass", "test") would also match
# ordinary words in the error lines it is searched in. A short URL password is still hidden — structurally, by
# ``redact_url`` and by never leaving the transport — and API keys are far longer than this.
MIN_SECRET_CHARS = 8

# Query parameter names that carry credentials (case-insensitive, matched anywhere in the name so ``x-api-key``,
# ``access_token``, ``client_secret`` and ``sig`` all count). Over-matching only masks a harmless value.
_CREDENTIAL_PARAM = re.compile(r"key|token|secret|passw|pwd|auth|sig|credential|session", re.IGNORECASE)


def is_credential_param(name: str) -> bool:
    return bool(_CREDENTIAL_PARAM.search(name))


class Secrets:
    """The set of secret strings known to this process, and ``redact`` to hide them in any text."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()  # the suite and fleet write from worker threads too

    def add(self, secret: str | None) -> None:
        """Remember ``secret`` and the forms a server may echo it in (URL-quoted, JSON-escaped, in Basic auth)."""
        if not secret or len(secret) < MIN_SECRET_CHARS:
            return
        forms = {secret, quote(secret, safe=""), quote_plus(secret), json.dumps(secret)[1:-1]}
        with self._lock:
            self._values |= {f for f in forms if len(f) >= MIN_SECRET_CHARS}

    def add_basic(self, user: str, password: str) -> None:
        """A Basic credential as it travels: base64 of ``user:password`` is as good as the password itself."""
        self.add(password)
        self.add(base64.b64encode(f"{user}:{password}".encode()).decode("ascii"))

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

    def __len__(self) -> int:
        return len(self._values)

    def redact_whole(self, text: str) -> str:
        """``text`` with every whole known secret (in any of its forms) replaced by ``***``.

        For what a model wrote (a reply, a tool call's arguments): its text is kept as written except the secrets,
        so a leading part of a key alone (``sk-proj-``, which the model may well write) is left as it is.
        """
        if not text or not self._values:
            return text
        with self._lock:
            values = sorted(self._values, key=len, reverse=True)
        for value in values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def redact(self, text: str) -> str:
        """``text`` with every known secret replaced by ``***`` (longest first, so no fragment of one survives).

        A leading part of a secret (``MIN_SECRET_CHARS`` or more) is masked too: the client keeps the first few
        hundred characters of an error body, and a key that straddles the cut must not leave its first half.
        """
        if not text or not self._values:
            return text
        with self._lock:
            values = sorted(self._values, key=len, reverse=True)
        for value in values:  # whole secrets first: a leading part of one may be the whole of another's form
            if value in text:
                text = text.replace(value, MASK)
        for value in values:
            head = value[:MIN_SECRET_CHARS]
            start = text.find(head)
            while start != -1:
                end = start + MIN_SECRET_CHARS
                while end < len(text) and end - start < len(value) and text[end] == value[end - start]:
                    end += 1
                text = text[:start] + MASK + text[end:]
                start = text.find(head, start + len(MASK))
        return text


SECRETS = Secrets()


def redact(text: str) -> str:
    """``text`` safe to write or print: the run's secrets replaced by ``***``."""
    return SECRETS.redact(text)


def redact_optional(text: str | None) -> str | None:
    return None if text is None else SECRETS.redact(text)


@dataclass(frozen=True)
class UrlCredentials:
    """What ``split_url`` took out of a URL: sent with every request, never recorded."""

    user: str | None = None
    password: str | None = None
    params: tuple[tuple[str, str], ...] = field(default=())  # the whole query: string-joined paths cannot carry it

    def __bool__(self) -> bool:
        return self.user is not None or bool(self.params)

    def __repr__(self) -> str:  # never show the values
        return f"UrlCredentials(user={'<hidden>' if self.user is not None else None}, params={len(self.params)})"


@dataclass(frozen=True)
class ServerUrl:
    """A ``--url`` taken apart: ``base`` to build request URLs on, ``shown`` to record, ``credentials`` to send."""

    base: str  # scheme://host[:port]/path — no userinfo, no query
    shown: str  # the URL with its credentials masked, for results, history, reports and the console
    credentials: UrlCredentials


def split_url(url: str) -> ServerUrl:
    """Take ``url`` apart (see ``ServerUrl``); every secret found in it is registered in ``SECRETS``.

    The query moves to the credentials whole, because request URLs are built by joining paths onto the base
    (``base + "/chat/completions"``) and a query left in the base would end up in the middle of the path.
    """
    try:
        parts = urlsplit(url)
        user, password, host, port = parts.username, parts.password, parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigError(f"--url {redact_url_text(url)!r} is not a URL ({exc})") from exc
    # The userinfo is percent-encoded in the URL and sent decoded; both spellings are secrets.
    raw_user, raw_password = user, password
    user = unquote(user) if user is not None else None
    password = unquote(password) if password is not None else None
    if password is not None:
        SECRETS.add_basic(user or "", password)
        SECRETS.add(raw_password)
    elif user:
        SECRETS.add(user)  # a bare userinfo (``https://TOKEN@host``) is a token
        SECRETS.add(raw_user)
    query = tuple(parse_qsl(parts.query, keep_blank_values=True))
    for name, value in query:
        if is_credential_param(name):
            SECRETS.add(value)
    hostname = host or ""
    if ":" in hostname:
        hostname = f"[{hostname}]"  # an IPv6 literal keeps its brackets
    netloc = hostname + (f":{port}" if port is not None else "")
    base = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return ServerUrl(base=base, shown=redact_url(url), credentials=UrlCredentials(user, password, query))


def redact_url(url: str) -> str:
    """``url`` as it may be shown: the userinfo password (or a bare user token) and credential parameters masked."""
    try:
        parts = urlsplit(url)
        user, password, host = parts.username, parts.password, parts.hostname
        port = parts.port
    except ValueError:  # not a URL we can take apart (a bad port): mask by pattern instead
        return redact_url_text(url)
    netloc = parts.netloc
    if user is not None or password is not None:
        hostport = netloc.rpartition("@")[2] if host is not None or port is not None else ""
        shown = f"{user}:{MASK}" if password is not None else MASK
        netloc = f"{shown}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_credential_param(k) for k, _ in pairs):
            query = urlencode([(k, MASK if is_credential_param(k) else v) for k, v in pairs], safe="*")
    return redact(urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)))


def redact_url_text(text: str) -> str:
    """A URL-ish string that would not parse, as it may be shown: anything between ``//`` and ``@`` and any
    credential parameter's value masked, besides the known secrets."""
    text = re.sub(r"(//)[^/@?#]*@", rf"\g<1>{MASK}@", text)
    # is_credential_param's names: a list of its own here once missed ``session`` and ``credential``.
    text = re.sub(rf"([?&;][^=&;#]*(?:{_CREDENTIAL_PARAM.pattern})[^=&;#]*=)[^&;#]*", rf"\g<1>{MASK}", text,
                  flags=re.IGNORECASE)  # fmt: skip
    return redact(text)
