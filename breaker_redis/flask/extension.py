"""FlaskBreakers: building an app's protection from its settings, declaring breakers, the public API.

Nothing here talks to Redis at import or ``init_app`` time: the Breakers are
built on a client that connects on first use, in the worker process, so the
extension is safe with gunicorn ``--preload`` (nothing shared across fork).
What happens during a request is in ``hooks``; this module only sets it up.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

from flask import Flask, current_app

from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.breakers import Breakers
from breaker_redis.engine.core import MISSING
from breaker_redis.flask.admin import install_admin
from breaker_redis.flask.cli import breakers_group
from breaker_redis.flask.hooks import install_hooks, misplaced_message, misplaced_protect, protected_view
from breaker_redis.flask.outbound import guarded_call
from breaker_redis.flask.routes import CONFIG_FIELDS, Classifier, make_spec
from breaker_redis.flask.settings import CONFIG_KEYS as CONFIG_KEYS
from breaker_redis.flask.settings import EXTRA_ARGUMENTS as EXTRA_ARGUMENTS
from breaker_redis.flask.settings import read_settings
from breaker_redis.flask.state import EXTENSION_KEY, AppState, Warnings
from breaker_redis.urls import client_from_url
from breaker_redis.web.routes import checked_name, route_config

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


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
        # Breaker configs declared by protect()/outbound()/breaker(), for every app,
        # and where each was declared (for errors).
        self._declared: dict[str, dict[str, Any]] = {}
        self._declared_where: dict[str, str] = {}
        self._declared_lock = threading.Lock()
        self._warnings = Warnings()
        self._states: list[AppState] = []  # every app initialised: a later declaration is checked on each
        if app is not None:
            self.init_app(app)

    # -- set-up ----------------------------------------------------------------

    def init_app(self, app: Flask) -> None:
        """Read and check the config, build the Breakers (no connection yet), install the hooks.

        Everything that can be wrong is an error here, naming the key or the
        route: a ``BREAKER_*`` value, a route option, a breaker name, a
        config declared by ``protect()`` that does not hold over this app's
        ``BREAKER_DEFAULTS``. An unknown ``BREAKER_*`` key is a warning.
        """
        settings = read_settings(app.config, self.overrides)
        defaults = settings.defaults
        breakers = self.overrides.get("breakers")
        if breakers is None:
            options: dict[str, Any] = {
                "on_store_error": settings.on_store_error,
                "defaults": defaults,
                "reporter": settings.reporter,
            }
            for extra in ("clock", "listen", "key_ttl_seconds"):
                if extra in self.overrides:
                    options[extra] = self.overrides[extra]
            client = self.overrides.get("client")
            if client is None:
                label = "redis_url" if "redis_url" in self.overrides else "BREAKER_REDIS_URL"
                try:
                    client = client_from_url(settings.redis_url)
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"{label}: {exc}") from None
            breakers = Breakers(client, settings.key_prefix, **options)
        elif not isinstance(breakers, Breakers):
            raise TypeError("breakers= must be a breaker_redis.Breakers")
        state = AppState(breakers, settings, self._declared, self._warnings)
        # Fail at start-up, not at the first request: every declared config
        # must agree with BREAKER_ROUTES and be valid over BREAKER_DEFAULTS.
        for name, config in settings.route_configs.items():
            self._declare(name, config, f"BREAKER_ROUTES[{name!r}]", check_only=True)
        with self._declared_lock:
            declared = list(self._declared.items())
        for name, config in declared:
            route_config(defaults, config, self._declared_where.get(name, repr(name)))
        misplaced = misplaced_protect(app.view_functions)  # views registered before init_app
        if misplaced:
            raise TypeError(misplaced_message(misplaced))
        app.extensions[EXTENSION_KEY] = state
        self._states.append(state)

        install_hooks(app, state)
        app.cli.add_command(breakers_group(), "breakers")  # flask breakers status | show NAME | ...
        if state.settings.admin_token:
            install_admin(app, state, settings.admin_path, dashboard=settings.dashboard)

    def _declare(self, name: str, config: Mapping[str, Any], where: str, check_only: bool = False) -> None:
        """One config per breaker name: two places configuring it differently is
        an error at declaration time, not a surprise at the first outage.
        With an app already initialised the config is checked over its defaults now too."""
        checked_name(name, where)
        if config:
            for state in self._states:
                route_config(state.settings.defaults, config, where)
        with self._declared_lock:
            known = self._declared.get(name)
            if known is not None and known != dict(config):
                raise ValueError(f"{where}: breaker {name!r} is already declared with {known}")
            if known is None and (config or not check_only):
                self._declared[name] = dict(config)
                self._declared_where[name] = where

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
        """Protect a view with breaker ``name``. Put it below ``@app.route``: above it,
        the route would serve the bare view, so that order is an error when the app is
        set up (at the decorator, or at ``init_app``; a blueprint registered after
        ``init_app`` is logged as an error at its first request). A view has one
        breaker: protecting it twice is an error.

        ``fallback``: a Fallback (static/cached/function/chain), a callable
        (a function fallback) or a body (static). ``classify(response)``
        returns "success" / "failure" / "ignored", True (failure) / False
        (success), or None to fall back to the status lists. Other keyword
        arguments are BreakerConfig fields over ``BREAKER_DEFAULTS``.
        """
        where = f"protect({name!r})"
        self._check_config(config, where)
        self._declare(name, config, where)
        options = {
            "fallback": fallback,
            "failure_statuses": failure_statuses,
            "ignore_statuses": ignore_statuses,
            "classify": classify,
            "message": message,
            "fallback_on_failure": fallback_on_failure,
        }
        spec = make_spec(name, options, where)

        def decorate(view: F) -> F:
            wrapped = protected_view(view, spec)
            for state in self._states:  # an app already set up: the view registered bare?
                if state.app is not None and (found := misplaced_protect(state.app.view_functions)):
                    raise TypeError(misplaced_message(found))
            return wrapped

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
        where = f"outbound({name!r})"
        checked_name(name, where)
        if config:
            self._check_config(config, where)
            self._declare(name, config, where)

        def decorate(fn: F) -> F:
            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return self.call(name, fn, *args, fallback=fallback, **kwargs)

            return cast(F, wrapper)

        return decorate
