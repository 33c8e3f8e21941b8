"""What one app's protection needs at request time, kept in ``app.extensions``.

The hooks, the admin endpoints and outbound calls all start from an AppState,
so none of them needs the extension object, and one extension can serve
several apps (each with its own Breakers and routes) at once.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from breaker_redis.base.names import validate_name
from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.breakers import Breakers
from breaker_redis.flask.routes import RouteSpec
from breaker_redis.flask.settings import Settings
from breaker_redis.ops.reader import Reader
from breaker_redis.web.http_policy import Warnings as Warnings
from breaker_redis.web.routes import RouteTable, guard_id

if TYPE_CHECKING:
    from flask import Flask

EXTENSION_KEY = "breaker_redis"
BY_PATH: Any = object()  # a view whose requests BREAKER_ROUTES guards by path, or not


class Guarded:
    """A route as a request meets it: its spec, the id of its breaker among the
    request's guards, and its Breaker (built at the first request that needs it)."""

    __slots__ = ("breaker", "guard", "spec")

    def __init__(self, spec: RouteSpec, guard: str) -> None:
        self.spec = spec
        self.guard = guard
        self.breaker: Breaker | None = None


@dataclass
class AppState:
    """One app's Breakers, routes and configs.

    ``declared`` and ``warnings`` are the extension's own objects, shared by
    every app it was initialised on: a config declared by ``protect()`` or
    ``breaker()`` holds for all of them.
    """

    breakers: Breakers
    settings: Settings  # what init_app read: the defaults, the routes, their configs, the admin token
    declared: dict[str, dict[str, Any]]
    warnings: Warnings
    resolved: dict[str, Breaker] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _reader: Reader | None = None
    app: Flask | None = None
    # What guards each view function's requests (hooks.route_of_view), filled at its first request.
    by_view: dict[Any, Any] = field(default_factory=dict)
    # Where an admitted request keeps its exchange (web/exchange.py) in the WSGI environ: one key per app.
    pending_key: str = field(init=False)
    table: RouteTable[Guarded] = field(init=False)  # BREAKER_ROUTES, as requests meet them
    # warnings.warn, bound once, not per request: the hooks hand it to judge() on every response.
    warn: Callable[[str, str], None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.pending_key = f"breaker_redis.flask.{id(self):x}"
        self.table = RouteTable((prefix, self.guarded(spec)) for prefix, spec in self.settings.routes)
        self.warn = self.warnings.warn

    def guarded(self, spec: RouteSpec) -> Guarded:
        return Guarded(spec, guard_id(self.breakers.prefix, spec.name))

    def reader(self) -> Reader:
        """Every breaker under the app's prefix, read the way the CLI reads them
        (the window as the workers last wrote it), on the app's client and by the
        breakers' clock (a test's, if they were given one)."""
        if self._reader is None:
            with self.lock:
                if self._reader is None:
                    self._reader = Reader(
                        self.breakers.client,
                        self.breakers.prefix,
                        owns_client=False,
                        clock=self.breakers.clock,
                    )
        return self._reader

    def app_names(self) -> set[str]:
        """The breakers this app declared or built, whether or not Redis has them yet."""
        routed = {spec.name for _prefix, spec in self.settings.routes}  # a bare name in BREAKER_ROUTES too
        return set(self.declared) | set(self.settings.route_configs) | routed | set(self.resolved)

    def knows(self, name: str) -> bool:
        """Declared by this app, or known in Redis (an admin call never creates a breaker)."""
        try:
            validate_name(name)
        except ValueError:
            return False
        return name in self.app_names() or self.reader().known(name)

    def breaker(self, name: str) -> Breaker:
        """The Breaker called name, built on first use from its declared config
        (or the one BREAKER_ROUTES gives it) over the app's defaults."""
        breaker = self.resolved.get(name)
        if breaker is not None:
            return breaker
        with self.lock:
            defaults = self.settings.defaults
            config = self.declared.get(name) or self.settings.route_configs.get(name) or {}
            built = dataclasses.replace(defaults, **config) if config else defaults
            breaker = self.breakers.get(name, built)
            self.resolved[name] = breaker
        return breaker
