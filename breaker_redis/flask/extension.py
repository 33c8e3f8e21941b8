"""FlaskBreakers: reading the app's config, declaring breakers, the public API.

Nothing here talks to Redis at import or ``init_app`` time: the Breakers are
built on a client that connects on first use, in the worker process, so the
extension is safe with gunicorn ``--preload`` (nothing shared across fork).
What happens during a request is in ``hooks``; this module only sets it up.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

from flask import Flask, current_app

from ..breaker import Breaker
from ..breakers import Breakers
from ..config import BreakerConfig
from ..wrappers import MISSING
from .admin import install_admin
from .cli import breakers_group
from .hooks import install_hooks, protected_view
from .outbound import guarded_call
from .routes import CONFIG_FIELDS, Classifier, make_spec, parse_routes
from .state import EXTENSION_KEY, AppState, Warnings

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# Constructor argument -> (config key, default). Constructor arguments win.
CONFIG_KEYS: dict[str, tuple[str, Any]] = {
    "redis_url": ("BREAKER_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "key_prefix": ("BREAKER_KEY_PREFIX", "breaker"),
    "defaults": ("BREAKER_DEFAULTS", None),
    "routes": ("BREAKER_ROUTES", None),
    "on_store_error": ("BREAKER_ON_STORE_ERROR", "local"),
    "admin_token": ("BREAKER_ADMIN_TOKEN", None),
    "dashboard": ("BREAKER_DASHBOARD", False),
}
# Constructor arguments with no config key: objects, not settings.
EXTRA_ARGUMENTS = ("client", "breakers", "clock", "listen", "key_ttl_seconds", "admin_path")


class FlaskBreakers:
    """The Flask extension. ``FlaskBreakers(app)`` or ``FlaskBreakers()`` + ``init_app(app)``.

    Keyword arguments override the app's config: ``redis_url``,
    ``key_prefix``, ``defaults``, ``routes``, ``on_store_error``,
    ``admin_token``, ``dashboard`` (``BREAKER_*`` keys), plus ``client`` (a ready redis
    client), ``breakers`` (a ready Breakers), ``clock``, ``listen``,
    ``key_ttl_seconds`` and ``admin_path`` (default ``/_breakers``).
    """

    def __init__(self, app: Flask | None = None, **overrides: Any) -> None:
        unknown = set(overrides) - set(CONFIG_KEYS) - set(EXTRA_ARGUMENTS)
        if unknown:
            raise TypeError(
                f"FlaskBreakers() got unknown arguments {sorted(unknown)}; "
                f"known: {', '.join([*CONFIG_KEYS, *EXTRA_ARGUMENTS])}"
            )
        self.overrides = overrides
        self.app = app
        # Breaker configs declared by protect()/outbound()/breaker(), for every app.
        self._declared: dict[str, dict[str, Any]] = {}
        self._declared_lock = threading.Lock()
        self._warnings = Warnings()
        if app is not None:
            self.init_app(app)

    # -- set-up ----------------------------------------------------------------

    def _setting(self, app: Flask, name: str) -> Any:
        key, default = CONFIG_KEYS[name]
        if name in self.overrides:
            return self.overrides[name]
        return app.config.get(key, default)

    def init_app(self, app: Flask) -> None:
        """Read the config, build the Breakers (no connection yet), install the hooks."""
        defaults = self._defaults(self._setting(app, "defaults"))
        breakers = self.overrides.get("breakers")
        if breakers is None:
            options: dict[str, Any] = {
                "on_store_error": self._setting(app, "on_store_error"),
                "defaults": defaults,
            }
            for extra in ("clock", "listen", "key_ttl_seconds"):
                if extra in self.overrides:
                    options[extra] = self.overrides[extra]
            prefix = self._setting(app, "key_prefix")
            client = self.overrides.get("client")
            if client is not None:
                breakers = Breakers(client, prefix, **options)
            else:
                breakers = Breakers.from_url(self._setting(app, "redis_url"), prefix, **options)
        elif not isinstance(breakers, Breakers):
            raise TypeError("breakers= must be a breaker_redis.Breakers")
        routes, route_configs = parse_routes(self._setting(app, "routes"))
        token = self._setting(app, "admin_token")
        dashboard = self._setting(app, "dashboard")
        if not isinstance(dashboard, bool):
            raise TypeError(f"BREAKER_DASHBOARD must be True or False, not {dashboard!r}")
        if dashboard and not token:
            raise ValueError(
                "BREAKER_DASHBOARD is True but BREAKER_ADMIN_TOKEN is not set: "
                "the dashboard is only served behind the admin token"
            )
        state = AppState(
            breakers,
            defaults,
            routes,
            route_configs,
            str(token) if token else None,
            self._declared,
            self._warnings,
        )
        # Fail at start-up, not at the first request: every declared config
        # must agree with BREAKER_ROUTES and be valid over BREAKER_DEFAULTS.
        for name, config in route_configs.items():
            self._declare(name, config, f"BREAKER_ROUTES[{name!r}]", check_only=True)
        for config in [*route_configs.values(), *self._declared.values()]:
            dataclasses.replace(defaults, **config)
        app.extensions[EXTENSION_KEY] = state

        install_hooks(app, state)
        app.cli.add_command(breakers_group(), "breakers")  # flask breakers status | show NAME | ...
        if state.admin_token:
            path = str(self.overrides.get("admin_path", "/_breakers"))
            install_admin(app, state, path, dashboard=dashboard)

    @staticmethod
    def _defaults(value: Any) -> BreakerConfig:
        if value is None:
            return BreakerConfig()
        if isinstance(value, BreakerConfig):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - CONFIG_FIELDS
            if unknown:
                raise ValueError(f"BREAKER_DEFAULTS: unknown BreakerConfig fields {sorted(unknown)}")
            return BreakerConfig(**dict(value))
        raise TypeError("BREAKER_DEFAULTS must be a dict of BreakerConfig fields or a BreakerConfig")

    def _declare(self, name: str, config: Mapping[str, Any], where: str, check_only: bool = False) -> None:
        """One config per breaker name: two places configuring it differently is
        an error at declaration time, not a surprise at the first outage.
        With the app already initialised the config is validated now too."""
        state = self.app.extensions.get(EXTENSION_KEY) if self.app is not None else None
        if isinstance(state, AppState) and config:
            dataclasses.replace(state.defaults, **config)
        with self._declared_lock:
            known = self._declared.get(name)
            if known is not None and known != dict(config):
                raise ValueError(f"{where}: breaker {name!r} is already declared with {known}")
            if known is None and (config or not check_only):
                self._declared[name] = dict(config)

    @staticmethod
    def _check_config(config: Mapping[str, Any], where: str) -> None:
        unknown = set(config) - CONFIG_FIELDS
        if unknown:
            raise ValueError(f"{where}: unknown BreakerConfig fields {sorted(unknown)}")

    def _state(self) -> AppState:
        try:
            app = current_app._get_current_object()  # type: ignore[attr-defined]
        except RuntimeError:
            app = self.app
            if app is None:
                raise RuntimeError(
                    "FlaskBreakers: no application context and no app bound to the extension"
                ) from None
        state = cast(Flask, app).extensions.get(EXTENSION_KEY)
        if state is None:
            raise RuntimeError("FlaskBreakers.init_app(app) was not called for this app")
        return cast(AppState, state)

    # -- public API ------------------------------------------------------------------

    @property
    def breakers(self) -> Breakers:
        """The core Breakers of the current app (or the bound app)."""
        return self._state().breakers

    def breaker(self, name: str, **config: Any) -> Breaker:
        """The core Breaker called name; config (BreakerConfig fields) declares it."""
        if config:
            self._check_config(config, f"breaker({name!r})")
            self._declare(name, config, f"breaker({name!r})")
        return self._state().breaker(name)

    def protect(
        self,
        name: str,
        fallback: Any = None,
        *,
        failure_statuses: Iterable[int] | None = None,
        ignore_statuses: Iterable[int] | None = None,
        classify: Classifier | None = None,
        message: str | None = None,
        fallback_on_failure: bool = True,
        **config: Any,
    ) -> Callable[[F], F]:
        """Protect a view with breaker ``name``. Put it below ``@app.route``.

        ``fallback``: a Fallback (static/cached/function/chain), a callable
        (a function fallback) or a body (static). ``classify(response)``
        returns "success" / "failure" / "ignored", True (failure) / False
        (success), or None to fall back to the status lists. Other keyword
        arguments are BreakerConfig fields over ``BREAKER_DEFAULTS``.
        """
        self._check_config(config, f"protect({name!r})")
        self._declare(name, config, f"protect({name!r})")
        spec = make_spec(
            name,
            {
                "fallback": fallback,
                "failure_statuses": failure_statuses,
                "ignore_statuses": ignore_statuses,
                "classify": classify,
                "message": message,
                "fallback_on_failure": fallback_on_failure,
            },
        )

        def decorate(view: F) -> F:
            return protected_view(view, spec)

        return decorate

    def call(
        self, name: str, fn: Callable[..., T], /, *args: Any, fallback: Any = MISSING, **kwargs: Any
    ) -> T:
        """Run an outbound call a view makes (another service, a database) behind breaker ``name``.

        Exceptions (a ``requests`` timeout, a refused connection) are
        classified by the breaker's config; a result with a ``status_code``
        in 500-599 (a ``requests.Response``) is a failure too, and is
        returned as it is unless there is a fallback. ``fallback``: a value,
        or a callable given the BreakerOpen, the exception, or a CallFailed.
        Without a fallback a refusal raises BreakerOpen, which becomes a 503
        if the view lets it escape.
        """
        return guarded_call(self._state().breaker(name), fn, *args, fallback=fallback, **kwargs)

    def outbound(self, name: str, fallback: Any = MISSING, **config: Any) -> Callable[[F], F]:
        """Decorator form of ``call``: ``@breakers.outbound("inventory", fallback=[])``."""
        if config:
            self._check_config(config, f"outbound({name!r})")
            self._declare(name, config, f"outbound({name!r})")

        def decorate(fn: F) -> F:
            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return self.call(name, fn, *args, fallback=fallback, **kwargs)

            return cast(F, wrapper)

        return decorate
