"""FlaskBreakers: circuit breakers for Flask routes and for the calls views make.

A protected request is a short walk through three hooks, so that protection
works the same for decorated views and for ``BREAKER_ROUTES`` prefixes (an
OpenResty ``location`` for apps that do not want decorators):

- ``before_request`` asks the breaker for a permit; a refusal becomes the
  route's fallback or a 503 ``BreakerOpenError`` (Retry-After, a friendly
  message, JSON when the client asks for JSON) and the view never runs;
- ``after_request`` classifies the response (5xx or an exception: failure,
  anything else: success, configurable) and may swap a failed response for
  the fallback;
- ``teardown_request`` records the outcome. It runs for every request, also
  when the view or a later hook raised, so a permit is always settled
  exactly once (the Permit itself ignores a second record), and it runs
  before the WSGI server sends the body, so the next request already sees a
  trip this one caused.

Nothing here talks to Redis at import or ``init_app`` time: the Breakers are
built on a client that connects on first use, in the worker process, so the
extension is safe with gunicorn ``--preload`` (nothing shared across fork)
and with threaded workers (all per-request data lives in ``flask.g``).
This is the only module of the package that imports Flask.
"""

from __future__ import annotations

import dataclasses
import functools
import hmac
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from flask import (
    Flask,
    Response,
    current_app,
    g,
    got_request_exception,
    has_request_context,
    jsonify,
    request,
)
from werkzeug.datastructures import MIMEAccept
from werkzeug.exceptions import HTTPException, ServiceUnavailable
from werkzeug.http import parse_accept_header
from werkzeug.wrappers import Response as WerkzeugResponse

from . import Breaker, Breakers, Permit
from .config import BreakerConfig, config_field_names
from .errors import BreakerOpen
from .fallbacks import Fallback, FallbackContext, FallbackResponse, Served, as_fallback

log = logging.getLogger("breaker_redis")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

EXTENSION_KEY = "breaker_redis"
FALLBACK_HEADER = "X-Breaker-Fallback"
BREAKER_HEADER = "X-Breaker"
REASON_HEADER = "X-Breaker-Reason"
DEFAULT_FAILURE_STATUSES = frozenset(range(500, 600))

# Constructor argument -> (config key, default). Constructor arguments win.
CONFIG_KEYS: dict[str, tuple[str, Any]] = {
    "redis_url": ("BREAKER_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "key_prefix": ("BREAKER_KEY_PREFIX", "breaker"),
    "defaults": ("BREAKER_DEFAULTS", None),
    "routes": ("BREAKER_ROUTES", None),
    "on_store_error": ("BREAKER_ON_STORE_ERROR", "local"),
    "admin_token": ("BREAKER_ADMIN_TOKEN", None),
}
# Constructor arguments with no config key: objects, not settings.
EXTRA_ARGUMENTS = ("client", "breakers", "clock", "listen", "key_ttl_seconds", "admin_path")
ROUTE_OPTIONS = (
    "breaker",
    "fallback",
    "failure_statuses",
    "ignore_statuses",
    "classify",
    "message",
    "fallback_on_failure",
)
_CONFIG_FIELDS = frozenset(config_field_names())
_MISSING: Any = object()

Classifier = Callable[[Response], "str | bool | None"]


# -- the refusal ---------------------------------------------------------------


def retry_after_seconds(refused: BreakerOpen, config: BreakerConfig | None = None) -> int:
    """Retry-After in whole seconds, at least 1.

    Unknown (a half-open breaker whose probe slots are taken, a full
    bulkhead) means "soon": 1 s. A forced-open breaker has no end, so it
    advertises the breaker's open period rather than inviting a retry storm.
    """
    if refused.retry_after is not None:
        return max(1, math.ceil(refused.retry_after))
    if refused.reason == "forced_open" and config is not None:
        return max(1, math.ceil(config.open_seconds))
    return 1


def default_message(breaker: str) -> str:
    return f"The {breaker} service is temporarily unavailable, please retry later."


def wants_json(environ: Mapping[str, Any] | None) -> bool:
    """JSON when the client names a JSON type at least as willingly as HTML;
    with no preference (no Accept, or only ``*/*``), when it sent JSON or is
    an XMLHttpRequest. curl and browsers get text."""
    if environ is None:
        return False
    accept = parse_accept_header(environ.get("HTTP_ACCEPT"), MIMEAccept)
    json_q = html_q = 0.0
    explicit = False
    for value, quality in accept:
        kind = value.lower()
        if kind == "*/*":
            continue
        explicit = True
        if kind in ("application/json", "application/*") or kind.endswith("+json"):
            json_q = max(json_q, quality)
        elif kind in ("text/html", "text/*"):
            html_q = max(html_q, quality)
    if explicit:
        return json_q > 0 and json_q >= html_q
    content_type = str(environ.get("CONTENT_TYPE", "")).lower()
    return "json" in content_type or environ.get("HTTP_X_REQUESTED_WITH") == "XMLHttpRequest"


class BreakerOpenError(ServiceUnavailable):
    """503 for a request the breaker refused. Register your own handler with
    ``@app.errorhandler(BreakerOpenError)``; ``.breaker``, ``.reason``,
    ``.retry_after`` (whole seconds) and ``.refused`` (the BreakerOpen) are there."""

    def __init__(self, refused: BreakerOpen, message: str | None = None, retry_after: int | None = None):
        self.refused = refused
        self.breaker = refused.breaker
        self.reason = refused.reason
        seconds = retry_after if retry_after is not None else retry_after_seconds(refused)
        super().__init__(message or default_message(refused.breaker), retry_after=seconds)

    def get_response(self, environ: Any = None, scope: Any = None) -> Any:
        # Werkzeug passes an environ dict or a request object.
        env = environ if isinstance(environ, dict) or environ is None else getattr(environ, "environ", None)
        headers = [*self.get_headers(env), (BREAKER_HEADER, self.breaker), (REASON_HEADER, self.reason)]
        if wants_json(env):
            import json

            body = json.dumps(
                {
                    "error": "service_unavailable",
                    "message": self.description,
                    "breaker": self.breaker,
                    "reason": self.reason,
                    "retry_after": self.retry_after,
                },
                ensure_ascii=False,
            )
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
            headers.append(("Content-Type", "application/json"))
        else:
            body = f"{self.description}\n"
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
            headers.append(("Content-Type", "text/plain; charset=utf-8"))
        return WerkzeugResponse(body, self.code, headers)


class CallFailed(Exception):
    """Handed to an outbound call's fallback when the call returned a failed
    result (e.g. a 503 ``requests.Response``) instead of raising."""

    def __init__(self, breaker: str, result: Any) -> None:
        self.breaker = breaker
        self.result = result
        super().__init__(f"call protected by breaker {breaker!r} returned a failed result")


# -- per route and per app -----------------------------------------------------


@dataclass(frozen=True)
class RouteSpec:
    """How one route (a decorated view or a BREAKER_ROUTES prefix) is protected."""

    name: str
    fallback: Fallback | None = None
    failure_statuses: frozenset[int] = DEFAULT_FAILURE_STATUSES
    ignore_statuses: frozenset[int] = frozenset()
    classify: Classifier | None = None
    message: str | None = None
    fallback_on_failure: bool = True


@dataclass
class _Pending:
    """One admitted request, kept in ``flask.g`` from before_request to teardown."""

    spec: RouteSpec
    breaker: Breaker
    permit: Permit
    exception: BaseException | None = None
    refused_inside: bool = False
    outcome: str | None = None
    response: Response | None = None


@dataclass
class _AppState:
    breakers: Breakers
    defaults: BreakerConfig
    routes: list[tuple[str, RouteSpec]]
    route_configs: dict[str, dict[str, Any]]
    admin_token: str | None
    resolved: dict[str, Breaker] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _statuses(value: Iterable[int] | None, default: frozenset[int]) -> frozenset[int]:
    return default if value is None else frozenset(int(s) for s in value)


def _split_options(options: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(route options, BreakerConfig fields); anything else is a clear error."""
    route: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for key, value in options.items():
        if key in ROUTE_OPTIONS:
            route[key] = value
        elif key in _CONFIG_FIELDS:
            config[key] = value
        else:
            raise ValueError(
                f"{where}: unknown option {key!r} (route options: {', '.join(ROUTE_OPTIONS)}; "
                f"or a BreakerConfig field)"
            )
    return route, config


def _make_spec(name: str, route: Mapping[str, Any]) -> RouteSpec:
    return RouteSpec(
        name=name,
        fallback=as_fallback(route.get("fallback")),
        failure_statuses=_statuses(route.get("failure_statuses"), DEFAULT_FAILURE_STATUSES),
        ignore_statuses=_statuses(route.get("ignore_statuses"), frozenset()),
        classify=route.get("classify"),
        message=route.get("message"),
        fallback_on_failure=bool(route.get("fallback_on_failure", True)),
    )


def _prefix_matches(prefix: str, path: str) -> bool:
    """``/pay`` covers ``/pay`` and ``/pay/...`` but not ``/payment``; ``/`` covers all."""
    if prefix.endswith("/"):
        return path.startswith(prefix) or path == prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


class FlaskBreakers:
    """The Flask extension. ``FlaskBreakers(app)`` or ``FlaskBreakers()`` + ``init_app(app)``.

    Keyword arguments override the app's config: ``redis_url``,
    ``key_prefix``, ``defaults``, ``routes``, ``on_store_error``,
    ``admin_token`` (``BREAKER_*`` keys), plus ``client`` (a ready redis
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
        self._warned: dict[str, float] = {}
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
        routes, route_configs = self._routes(self._setting(app, "routes"))
        token = self._setting(app, "admin_token")
        state = _AppState(breakers, defaults, routes, route_configs, str(token) if token else None)
        # Fail at start-up, not at the first request: every declared config
        # must agree with BREAKER_ROUTES and be valid over BREAKER_DEFAULTS.
        for name, config in route_configs.items():
            self._declare(name, config, f"BREAKER_ROUTES[{name!r}]", check_only=True)
        for config in [*route_configs.values(), *self._declared.values()]:
            dataclasses.replace(defaults, **config)
        app.extensions[EXTENSION_KEY] = state

        app.before_request(lambda: self._before_request(state))
        app.after_request(lambda response: self._after_request(state, response))
        app.teardown_request(lambda exc: self._teardown_request(state, exc))
        got_request_exception.connect(self._on_exception, app, weak=False)
        app.register_error_handler(BreakerOpen, self._inner_refusal)
        if state.admin_token:
            self._install_admin(app, state, str(self.overrides.get("admin_path", "/_breakers")))

    @staticmethod
    def _defaults(value: Any) -> BreakerConfig:
        if value is None:
            return BreakerConfig()
        if isinstance(value, BreakerConfig):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - _CONFIG_FIELDS
            if unknown:
                raise ValueError(f"BREAKER_DEFAULTS: unknown BreakerConfig fields {sorted(unknown)}")
            return BreakerConfig(**dict(value))
        raise TypeError("BREAKER_DEFAULTS must be a dict of BreakerConfig fields or a BreakerConfig")

    @staticmethod
    def _routes(value: Any) -> tuple[list[tuple[str, RouteSpec]], dict[str, dict[str, Any]]]:
        """BREAKER_ROUTES: {"/pay": "pay", "/cart": {"breaker": "cart", "fallback": ..., **config}}."""
        if value is None:
            return [], {}
        if not isinstance(value, Mapping):
            raise TypeError("BREAKER_ROUTES must map path prefixes to breaker names or dicts")
        routes: list[tuple[str, RouteSpec]] = []
        configs: dict[str, dict[str, Any]] = {}
        for prefix, target in value.items():
            if not isinstance(prefix, str) or not prefix.startswith("/"):
                raise ValueError(f"BREAKER_ROUTES: a prefix must start with '/' (got {prefix!r})")
            where = f"BREAKER_ROUTES[{prefix!r}]"
            route: dict[str, Any]
            config: dict[str, Any]
            if isinstance(target, str):
                route, config = {"breaker": target}, {}
            elif isinstance(target, Mapping):
                route, config = _split_options(target, where)
                if not isinstance(route.get("breaker"), str):
                    raise ValueError(f"{where}: needs 'breaker': NAME")
            else:
                raise TypeError(f"{where}: give a breaker name or a dict")
            name = route["breaker"]
            if config:  # a bare name uses the breaker; fields configure it
                if configs.get(name, config) != config:
                    raise ValueError(f"{where}: breaker {name!r} is configured differently by another prefix")
                configs[name] = config
            routes.append((prefix, _make_spec(name, route)))
        routes.sort(key=lambda item: len(item[0]), reverse=True)  # longest prefix wins
        return routes, configs

    def _declare(self, name: str, config: Mapping[str, Any], where: str, check_only: bool = False) -> None:
        """One config per breaker name: two places configuring it differently is
        an error at declaration time, not a surprise at the first outage.
        With the app already initialised the config is validated now too."""
        state = self.app.extensions.get(EXTENSION_KEY) if self.app is not None else None
        if isinstance(state, _AppState) and config:
            dataclasses.replace(state.defaults, **config)
        with self._declared_lock:
            known = self._declared.get(name)
            if known is not None and known != dict(config):
                raise ValueError(f"{where}: breaker {name!r} is already declared with {known}")
            if known is None and (config or not check_only):
                self._declared[name] = dict(config)

    def _state(self) -> _AppState:
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
        return cast(_AppState, state)

    def _breaker(self, state: _AppState, name: str) -> Breaker:
        breaker = state.resolved.get(name)
        if breaker is not None:
            return breaker
        with state.lock:
            config = self._declared.get(name) or state.route_configs.get(name) or {}
            built = dataclasses.replace(state.defaults, **config) if config else state.defaults
            breaker = state.breakers.get(name, built)
            state.resolved[name] = breaker
        return breaker

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
        return self._breaker(self._state(), name)

    @staticmethod
    def _check_config(config: Mapping[str, Any], where: str) -> None:
        unknown = set(config) - _CONFIG_FIELDS
        if unknown:
            raise ValueError(f"{where}: unknown BreakerConfig fields {sorted(unknown)}")

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
        spec = _make_spec(
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

        def note(exc: BaseException) -> None:
            # Seen here, an exception is classified by the breaker's config
            # even when an error handler turns it into a page.
            if not has_request_context():
                return  # called directly, outside a request: nothing to note
            pending = g.get("_breaker_redis")
            if isinstance(pending, _Pending) and pending.exception is None:
                pending.exception = exc

        def decorate(view: F) -> F:
            wrapper: Callable[..., Any]
            if inspect.iscoroutinefunction(view):

                @functools.wraps(view)
                async def wrapper(*args: Any, **kwargs: Any) -> Any:
                    try:
                        return await view(*args, **kwargs)
                    except BaseException as exc:
                        note(exc)
                        raise

            else:

                @functools.wraps(view)
                def wrapper(*args: Any, **kwargs: Any) -> Any:
                    try:
                        return view(*args, **kwargs)
                    except BaseException as exc:
                        note(exc)
                        raise

            wrapper._breaker_redis_spec = spec  # type: ignore[attr-defined]
            return cast(F, wrapper)

        return decorate

    def call(
        self, name: str, fn: Callable[..., T], /, *args: Any, fallback: Any = _MISSING, **kwargs: Any
    ) -> T:
        """Run an outbound call behind breaker ``name`` (the Go seed's ServiceWrapper).

        Exceptions (a ``requests`` timeout, a refused connection) are
        classified by the breaker's config; a result with a ``status_code``
        in 500-599 (a ``requests.Response``) is a failure too, and is
        returned as it is unless there is a fallback. ``fallback``: a value,
        or a callable given the BreakerOpen, the exception, or a CallFailed.
        Without a fallback a refusal raises BreakerOpen, which becomes a 503
        if the view lets it escape.
        """
        breaker = self._breaker(self._state(), name)
        try:
            permit = breaker.acquire()
        except BreakerOpen as refused:
            return cast(T, self._outbound_fallback(fallback, refused))
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            outcome = breaker.classify(exc)
            permit.record(outcome)
            if outcome == "failure" and fallback is not _MISSING:
                return cast(T, fallback(exc) if callable(fallback) else fallback)
            raise
        status = getattr(result, "status_code", None)
        if isinstance(status, int) and status in DEFAULT_FAILURE_STATUSES:
            permit.failure()
            if fallback is not _MISSING:
                failed = CallFailed(name, result)
                return cast(T, fallback(failed) if callable(fallback) else fallback)
            return result
        permit.success()
        return result

    @staticmethod
    def _outbound_fallback(fallback: Any, refused: BreakerOpen) -> Any:
        if fallback is _MISSING:
            raise refused
        return fallback(refused) if callable(fallback) else fallback

    def outbound(self, name: str, fallback: Any = _MISSING, **config: Any) -> Callable[[F], F]:
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

    # -- the hooks ---------------------------------------------------------------------

    def _spec_for_request(self, state: _AppState) -> RouteSpec | None:
        endpoint = request.endpoint
        if endpoint is not None:
            if endpoint.startswith("breaker_redis."):
                return None  # the admin endpoints are never behind a breaker
            view = current_app.view_functions.get(endpoint)
            spec = getattr(view, "_breaker_redis_spec", None)
            if isinstance(spec, RouteSpec):
                return spec
        path = request.path
        for prefix, spec in state.routes:
            if _prefix_matches(prefix, path):
                return spec
        return None

    def _before_request(self, state: _AppState) -> Any:
        if request.method == "OPTIONS":
            return None  # CORS preflights and automatic OPTIONS never reach a service
        spec = self._spec_for_request(state)
        if spec is None:
            return None
        breaker = self._breaker(state, spec.name)
        try:
            permit = breaker.acquire()
        except BreakerOpen as refused:
            served = self._serve(state, spec, refused)
            if served is not None:
                return served
            raise BreakerOpenError(
                refused, spec.message, retry_after_seconds(refused, breaker.config)
            ) from None
        except Exception:
            # Not an outage (the store gate handles those) but a bug: let the
            # request through rather than turn the breaker into the outage.
            self._warn(spec.name, "could not ask breaker %r; the request goes through unprotected")
            return None
        g._breaker_redis = _Pending(spec, breaker, permit)
        return None

    def _on_exception(self, sender: Any, exception: BaseException, **extra: Any) -> None:
        pending = g.get("_breaker_redis")
        if isinstance(pending, _Pending) and pending.exception is None:
            pending.exception = exception

    def _inner_refusal(self, refused: BreakerOpen) -> Any:
        """An outbound breaker refused inside a view and nobody caught it: 503.
        The route's own breaker ignores this request (its service was not asked)."""
        pending = g.get("_breaker_redis")
        if isinstance(pending, _Pending):
            pending.refused_inside = True
        config = None
        state = current_app.extensions.get(EXTENSION_KEY)
        if isinstance(state, _AppState) and refused.breaker in state.resolved:
            config = state.resolved[refused.breaker].config
        error = BreakerOpenError(refused, None, retry_after_seconds(refused, config))
        return error.get_response(request.environ)

    def _classify(self, pending: _Pending, response: Response) -> str:
        if pending.refused_inside or isinstance(pending.exception, BreakerOpen):
            return "ignored"
        exc = pending.exception
        if exc is not None and not isinstance(exc, HTTPException):
            return pending.breaker.classify(exc)
        spec = pending.spec
        if spec.classify is not None:
            verdict = spec.classify(response)
            if verdict is True:
                return "failure"
            if verdict is False:
                return "success"
            if verdict in ("success", "failure", "ignored"):
                return verdict
            if verdict is not None:
                raise ValueError(f"classify() of breaker {spec.name!r} returned {verdict!r}")
        if response.status_code in spec.ignore_statuses:
            return "ignored"
        if response.status_code in spec.failure_statuses:
            return "failure"
        return "success"

    def _after_request(self, state: _AppState, response: Response) -> Response:
        pending = g.get("_breaker_redis")
        if not isinstance(pending, _Pending) or pending.permit.recorded:
            return response
        try:
            outcome = self._classify(pending, response)
        except Exception:
            self._warn(pending.spec.name, "classify() of breaker %r raised; counted as a failure")
            outcome = "failure"
        pending.outcome = outcome
        if outcome == "success":
            pending.response = response
        elif outcome == "failure" and pending.spec.fallback_on_failure and pending.spec.fallback:
            served = self._serve(state, pending.spec, pending.exception)
            if served is not None:
                return served
        return response

    def _teardown_request(self, state: _AppState, exc: BaseException | None) -> None:
        pending = g.pop("_breaker_redis", None)
        if not isinstance(pending, _Pending) or pending.permit.recorded:
            return
        if exc is not None and not pending.refused_inside:
            outcome = pending.breaker.classify(exc)  # escaped the view or a later hook
        else:
            outcome = pending.outcome or "ignored"
        try:
            pending.permit.record(outcome)
        except Exception:  # a teardown that raises would turn a served response into a 500
            self._warn(pending.spec.name, "could not record an outcome of breaker %r")
        fallback = pending.spec.fallback
        if outcome == "success" and pending.response is not None and fallback and fallback.remembers:
            try:
                frozen = _freeze(pending.response)
                if frozen is not None:
                    fallback.remember(self._context(state, pending.spec.name, None), frozen)
            except Exception:
                self._warn(pending.spec.name, "could not remember a response of breaker %r")

    # -- fallbacks ----------------------------------------------------------------------

    def _context(self, state: _AppState, name: str, cause: BaseException | None) -> FallbackContext:
        query = request.query_string.decode("latin-1")
        method = request.method.upper()
        key_method = "GET" if method == "HEAD" else method
        return FallbackContext(
            breaker=name,
            cause=cause,
            key=f"{key_method} {request.path}{'?' + query if query else ''}",
            method=method,
            store=state.breakers.client,
            prefix=state.breakers.prefix,
            store_healthy=state.breakers.store_healthy,
            request=request._get_current_object(),  # type: ignore[attr-defined]
        )

    def _serve(self, state: _AppState, spec: RouteSpec, cause: BaseException | None) -> Response | None:
        if spec.fallback is None:
            return None
        try:
            served = spec.fallback.serve(self._context(state, spec.name, cause))
            return None if served is None else self._to_response(spec.name, served, cause)
        except Exception:
            self._warn(spec.name, "the fallback of breaker %r failed")
            return None

    @staticmethod
    def _to_response(name: str, served: Served, cause: BaseException | None) -> Response:
        value = served.value
        if isinstance(value, FallbackResponse):
            response = current_app.response_class(value.body, value.status, list(value.headers))
        else:
            response = current_app.make_response(value)
        response.headers[FALLBACK_HEADER] = served.kind
        response.headers[BREAKER_HEADER] = name
        if isinstance(cause, BreakerOpen):
            response.headers[REASON_HEADER] = cause.reason
        return response

    def _warn(self, name: str, message: str) -> None:
        """Log with traceback at most once a minute per breaker and message."""
        key = f"{name}:{message}"
        now = time.monotonic()
        if now - self._warned.get(key, -1e18) >= 60:
            self._warned[key] = now
            log.exception("breaker_redis: " + message, name)

    # -- admin endpoints (only with BREAKER_ADMIN_TOKEN) -----------------------------------

    def _install_admin(self, app: Flask, state: _AppState, path: str) -> None:
        """``GET {path}``: every breaker's snapshot; ``POST {path}/NAME/ACTION``
        with ACTION open | close | auto | reset. ``Authorization: Bearer TOKEN``."""
        token = str(state.admin_token).encode()
        actions = {"open": "force_open", "close": "force_closed", "auto": "clear_force", "reset": "reset"}

        def authorized() -> bool:
            header = request.headers.get("Authorization", "")
            given = header[7:] if header.startswith("Bearer ") else ""
            return hmac.compare_digest(given.encode(), token)

        def denied() -> Any:
            return jsonify(error="unauthorized"), 401, {"WWW-Authenticate": "Bearer"}

        def status() -> Any:
            if not authorized():
                return denied()
            names = set(state.breakers.names()) | set(self._declared) | set(state.route_configs)
            return jsonify(breakers=[self._breaker(state, n).snapshot() for n in sorted(names)])

        def act(name: str, action: str) -> Any:
            if not authorized():
                return denied()
            if action not in actions:
                return jsonify(error=f"unknown action {action!r}", actions=sorted(actions)), 404
            breaker = self._breaker(state, name)
            getattr(breaker, actions[action])()
            return jsonify(breaker.snapshot())

        base = path.rstrip("/")
        app.add_url_rule(base, "breaker_redis.status", status, methods=["GET"])
        app.add_url_rule(f"{base}/<name>/<action>", "breaker_redis.act", act, methods=["POST"])


def _freeze(response: Response) -> FallbackResponse | None:
    """The bytes, status and headers of a response, for the cache. A streamed
    body is never read here: that would consume it before the client gets it."""
    if response.is_streamed or response.direct_passthrough:
        return None
    return FallbackResponse(response.get_data(), response.status_code, tuple(response.headers.items()))


__all__ = [
    "BREAKER_HEADER",
    "FALLBACK_HEADER",
    "REASON_HEADER",
    "BreakerOpenError",
    "CallFailed",
    "FlaskBreakers",
    "RouteSpec",
    "default_message",
    "retry_after_seconds",
    "wants_json",
]
