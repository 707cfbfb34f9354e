"""The web views: where they listen, who may read and act (tokens), which Host names they answer to."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import SecretStr, model_validator

from app.settings._base import Group, setting


class WebSettings(Group):
    TITLE = "Web views"

    bind: str = setting("WEB_BIND", "127.0.0.1",
        description='Address of the web views.')

    port: int = setting("WEB_PORT", 6066, ge=1, le=65535,
        description='Port of the web views.')

    token: SecretStr | None = setting("WEB_TOKEN", None,
        description="The operator's bearer token: every `POST` must carry it; it reads every view whole, downloads "
                    'records and reads the audit of unmasked views (each unmasked view is audited); unset or empty: '
                    'actions answer 403. Surrounding spaces are no part of it.')

    read_token: SecretStr | None = setting("WEB_READ_TOKEN", None,
        description="The viewer's bearer token: reads the data views (the queue, orders, `t_idem` rows, Faust's own "
                    'views) with phone numbers, addresses, e-mail addresses and idempotency tokens masked, acts on '
                    'nothing, downloads nothing; with neither it nor `WEB_TOKEN` set, they answer 403.')

    tokens_file: str | None = setting("WEB_TOKENS_FILE", None,
        description='A file of per-person tokens, one line each: `name role sha256-hex` (role `operator` or '
                    '`viewer`; the SHA-256 of the token in hex, never the token; `#` starts a comment). A '
                    "person's token acts and reads as its role, and the audit names the person whatever a "
                    'request says; `faust -A app web-token NAME ROLE` makes a token and its line. Re-read when '
                    "it changes: removing a line revokes that token at the next request, without a restart. A "
                    'file that cannot be read stops the worker at start-up (exit 78); one broken later refuses '
                    'every per-person token until it is fixed. Works beside `WEB_TOKEN` and `WEB_READ_TOKEN`.')

    allowed_hosts: str = setting("WEB_ALLOWED_HOSTS", "",
        description='More `Host` names the web views answer to, comma-separated, besides `127.0.0.1`, `localhost`, '
                    '`::1`, `WEB_BIND` and the host of `WEB_PUBLIC_URL`; any other `Host` answers 421 (DNS '
                    'rebinding).')

    max_body_bytes: int = setting("WEB_MAX_BODY_BYTES", 16 * 1024, ge=256,
        description='The largest request body a view reads (413 beyond).')

    public_url: str | None = setting("WEB_PUBLIC_URL", None, shown='`http://WEB_BIND:WEB_PORT`',
        description="How people reach this worker's web views, for the links in alerts.")

    @property
    def base_url(self) -> str:
        """How people reach the web views: WEB_PUBLIC_URL, else http://WEB_BIND:WEB_PORT."""
        return (self.public_url or f"http://{self.bind}:{self.port}").rstrip("/")

    @property
    def host_names(self) -> frozenset[str]:
        """The Host names the web views answer to (lower case, no port)."""
        names = {"127.0.0.1", "localhost", "::1"}
        if self.bind not in ("0.0.0.0", "::", ""):
            names.add(self.bind.strip("[]"))
        if self.public_url:
            public = urlsplit(self.public_url).hostname
            if public:
                names.add(public)
        names.update(name.strip().strip("[]") for name in self.allowed_hosts.split(",") if name.strip())
        return frozenset(name.lower() for name in names)

    @model_validator(mode="after")
    def _strip_tokens(self) -> WebSettings:
        if self.tokens_file is not None and not self.tokens_file.strip():
            self.tokens_file = None
        # Surrounding spaces (a copy and paste, a YAML value) are no part of a token: a request's
        # token is compared stripped, so the configured one is too. WEB_TOKEN="" is no token.
        for name in ("token", "read_token"):
            token = getattr(self, name)
            if token is not None:
                value = token.get_secret_value().strip()
                setattr(self, name, SecretStr(value) if value else None)
        return self
