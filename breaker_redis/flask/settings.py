"""FlaskBreakers' settings: the ``BREAKER_*`` config keys and the constructor's
arguments, each checked when ``init_app`` reads it.

A wrong type or value is an error naming the key (or the argument), at
start-up; an unknown ``BREAKER_*`` key is most likely a typo of a known one
(``BREAKER_REDIS_ULR`` leaves the app on the default Redis without a word),
so it is logged as a warning naming the closest known key. Nothing here
connects to Redis.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from breaker_redis.base.config import BreakerConfig
from breaker_redis.base.names import validate_prefix
from breaker_redis.engine.reporters import validate_reporter
from breaker_redis.flask.routes import CONFIG_FIELDS, RouteSpec
from breaker_redis.storage.store import POLICIES
from breaker_redis.web.routes import parse_routes

log = logging.getLogger("breaker_redis")

# Constructor argument -> (config key, default). Constructor arguments win.
CONFIG_KEYS: dict[str, tuple[str, Any]] = {
    "redis_url": ("BREAKER_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "key_prefix": ("BREAKER_KEY_PREFIX", "breaker"),
    "defaults": ("BREAKER_DEFAULTS", None),
    "routes": ("BREAKER_ROUTES", None),
    "on_store_error": ("BREAKER_ON_STORE_ERROR", "local"),
    "admin_token": ("BREAKER_ADMIN_TOKEN", None),
    "dashboard": ("BREAKER_DASHBOARD", False),
    "reporter": ("BREAKER_REPORTER", None),  # None: the host name (breaker_redis/engine/reporters.py)
}
# Constructor arguments with no config key: objects, not settings.
EXTRA_ARGUMENTS = ("client", "breakers", "clock", "listen", "key_ttl_seconds", "admin_path")
KEY_PREFIX = "BREAKER_"
KNOWN_KEYS = tuple(key for key, _ in CONFIG_KEYS.values())


@dataclass(frozen=True)
class Settings:
    """What ``init_app`` builds an app's protection from, every value checked."""

    redis_url: str
    key_prefix: str
    defaults: BreakerConfig
    routes: list[tuple[str, RouteSpec]]
    route_configs: dict[str, dict[str, Any]]
    on_store_error: str
    admin_token: str | None
    dashboard: bool
    admin_path: str
    reporter: str | None = None


def warn_unknown_keys(config: Mapping[str, Any]) -> None:
    """A ``BREAKER_*`` key the extension does not read: logged with the closest known key."""
    for key in sorted(k for k in config if isinstance(k, str) and k.startswith(KEY_PREFIX)):
        if key in KNOWN_KEYS:
            continue
        suffixes = [known[len(KEY_PREFIX) :] for known in KNOWN_KEYS]
        close = difflib.get_close_matches(key[len(KEY_PREFIX) :], suffixes, n=1)
        hint = f"did you mean {KEY_PREFIX}{close[0]}?" if close else f"known: {', '.join(KNOWN_KEYS)}"
        log.warning("app.config[%r] is not a breaker_redis setting and is ignored; %s", key, hint)


class _Reader:
    """One setting at a time: the constructor's argument, else the app's config key, else
    the default; ``label`` is what an error names (the key, or the argument)."""

    def __init__(self, config: Mapping[str, Any], overrides: Mapping[str, Any]) -> None:
        self.config = config
        self.overrides = overrides

    def get(self, name: str) -> tuple[Any, str]:
        key, default = CONFIG_KEYS[name]
        if name in self.overrides:
            return self.overrides[name], name
        return self.config.get(key, default), key


def _defaults(value: Any, label: str) -> BreakerConfig:
    if value is None:
        return BreakerConfig()
    if isinstance(value, BreakerConfig):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{label} must be a dict of BreakerConfig fields or a BreakerConfig (got {value!r})")
    unknown = set(value) - CONFIG_FIELDS
    if unknown:
        raise ValueError(f"{label}: unknown BreakerConfig fields {sorted(map(str, unknown))}")
    try:
        return BreakerConfig(**dict(value))
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{label}: {exc}") from None


def _token(value: Any, label: str) -> str | None:
    if value is None or value == "":
        return None  # not set: no admin endpoints
    if not isinstance(value, str):
        raise TypeError(f"{label} must be a str (got {type(value).__name__})")
    if value != value.strip():
        # The header's credential is compared stripped: this token could never match.
        raise ValueError(f"{label} must not begin or end with whitespace (read from a file? .strip() it)")
    return value


def _validated(validate: Callable[[Any], object], value: Any, label: str) -> None:
    """``validate(value)``, its ValueError naming the setting it was read from."""
    try:
        validate(value)
    except ValueError as exc:
        raise ValueError(f"{label}: {exc}") from None


def read_settings(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> Settings:
    """Every setting of one app, checked; warns of unknown ``BREAKER_*`` keys."""
    warn_unknown_keys(config)
    read = _Reader(config, overrides)
    url, label = read.get("redis_url")
    if not isinstance(url, str):
        raise TypeError(f"{label} must be a Redis URL str such as redis://127.0.0.1:6379/0 (got {url!r})")
    prefix, label = read.get("key_prefix")
    _validated(validate_prefix, prefix, label)
    defaults = _defaults(*read.get("defaults"))
    routes_value, label = read.get("routes")
    routes, route_configs = parse_routes(routes_value, label, defaults)
    policy, label = read.get("on_store_error")
    if policy not in POLICIES:
        raise ValueError(f"{label} must be one of {', '.join(map(repr, POLICIES))} (got {policy!r})")
    token = _token(*read.get("admin_token"))
    dashboard, label = read.get("dashboard")
    if not isinstance(dashboard, bool):
        raise TypeError(f"{label} must be True or False, not {dashboard!r}")
    if dashboard and not token:
        raise ValueError(
            f"{label} is True but BREAKER_ADMIN_TOKEN is not set: "
            "the dashboard is only served behind the admin token"
        )
    path = overrides.get("admin_path", "/_breakers")
    if not isinstance(path, str) or not path.startswith("/") or not path.strip("/"):
        raise ValueError(f"admin_path must be a URL path below '/', such as '/_breakers' (got {path!r})")
    reporter, label = read.get("reporter")
    if reporter is not None:
        _validated(validate_reporter, reporter, label)
    return Settings(
        url, prefix, defaults, routes, route_configs, str(policy), token, dashboard, path, reporter
    )
