"""FlaskBreakers checks every setting at init_app: each BREAKER_* key (or the
constructor argument standing for it), every breaker name and every config
declared with protect()/breaker()/outbound(), before or after init_app. An
unknown BREAKER_* key is logged as a warning naming the closest known key.

Nothing here reaches Redis: every error is raised while the app is built.
"""

from __future__ import annotations

import logging
import re
import socket
from typing import Any

import fakeredis
import pytest
from flask import Flask

from breaker_redis import BreakerConfig
from breaker_redis.flask import FlaskBreakers


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{sock.getsockname()[1]}/0"


def build(config: dict[str, Any] | None = None, **overrides: Any) -> tuple[Flask, FlaskBreakers]:
    app = Flask(__name__)
    app.config["BREAKER_REDIS_URL"] = dead_url()  # nothing connects at set-up
    app.config.update(config or {})
    overrides.setdefault("listen", False)
    return app, FlaskBreakers(app, **overrides)


@pytest.mark.parametrize(
    ("config", "error", "says"),
    [
        ({"BREAKER_REDIS_URL": 6379}, TypeError, "BREAKER_REDIS_URL must be a Redis URL str"),
        (
            {"BREAKER_REDIS_URL": "localhost:6379"},
            ValueError,
            "BREAKER_REDIS_URL: Redis URL 'localhost:6379' has no scheme",
        ),
        ({"BREAKER_REDIS_URL": "redis://h:port/0"}, ValueError, "BREAKER_REDIS_URL: bad port 'port'"),
        (
            {"BREAKER_REDIS_URL": "memory://shared"},
            ValueError,
            "BREAKER_REDIS_URL: memory:// URL 'memory://shared' has more after the scheme",
        ),
        ({"BREAKER_KEY_PREFIX": "my shop"}, ValueError, "BREAKER_KEY_PREFIX: invalid key prefix 'my shop'"),
        ({"BREAKER_KEY_PREFIX": 7}, ValueError, "BREAKER_KEY_PREFIX: invalid key prefix 7"),
        ({"BREAKER_DEFAULTS": "count"}, TypeError, "BREAKER_DEFAULTS must be a dict of BreakerConfig fields"),
        (
            {"BREAKER_DEFAULTS": {"failure_treshold": 3}},
            ValueError,
            "BREAKER_DEFAULTS: unknown BreakerConfig fields ['failure_treshold']",
        ),
        (
            {"BREAKER_DEFAULTS": {"failure_threshold": "3"}},
            ValueError,
            "BREAKER_DEFAULTS: BreakerConfig.failure_threshold must be an integer",
        ),
        (
            {"BREAKER_DEFAULTS": {"record_exceptions": KeyError}},
            ValueError,
            "BREAKER_DEFAULTS: BreakerConfig.record_exceptions must be a tuple",
        ),
        ({"BREAKER_ROUTES": ["/pay"]}, TypeError, "BREAKER_ROUTES must map path prefixes"),
        (
            {"BREAKER_ROUTES": {"/pay": "my pay"}},
            ValueError,
            "BREAKER_ROUTES['/pay']: invalid breaker name 'my pay'",
        ),
        (
            {"BREAKER_ON_STORE_ERROR": "open"},
            ValueError,
            "BREAKER_ON_STORE_ERROR must be one of 'local', 'allow', 'deny' (got 'open')",
        ),
        ({"BREAKER_ADMIN_TOKEN": 12345}, TypeError, "BREAKER_ADMIN_TOKEN must be a str (got int)"),
        ({"BREAKER_ADMIN_TOKEN": "s3cret\n"}, ValueError, "BREAKER_ADMIN_TOKEN must not begin or end with"),
        ({"BREAKER_DASHBOARD": "yes"}, TypeError, "BREAKER_DASHBOARD must be True or False, not 'yes'"),
        ({"BREAKER_DASHBOARD": True}, ValueError, "BREAKER_DASHBOARD is True but BREAKER_ADMIN_TOKEN is not"),
        ({"BREAKER_REPORTER": "web 1"}, ValueError, "BREAKER_REPORTER: invalid reporter 'web 1'"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_wrong_config_value_fails_at_init_naming_its_key(config, error, says) -> None:
    with pytest.raises(error, match=re.escape(says)):
        build(config)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"redis_url": 6379}, "redis_url must be a Redis URL str"),
        ({"redis_url": "http://x"}, "redis_url: unsupported Redis URL scheme"),
        ({"redis_url": "memory:///0"}, "redis_url: memory:// URL 'memory:///0' has more after the scheme"),
        ({"key_prefix": "my shop"}, "key_prefix: invalid key prefix"),
        ({"on_store_error": "open"}, "on_store_error must be one of"),
        (
            {"routes": {"/pay": {"breaker": "pay", "failure_statuses": 502}}},
            "routes['/pay']: failure_statuses must be a collection of HTTP status codes",
        ),
        ({"admin_token": 1}, "admin_token must be a str"),
        ({"admin_token": "t", "admin_path": "admin"}, "admin_path must be a URL path below '/'"),
        ({"admin_token": "t", "admin_path": "/"}, "admin_path must be a URL path below '/'"),
    ],
)
def test_a_wrong_constructor_argument_fails_naming_the_argument(overrides, says) -> None:
    with pytest.raises((TypeError, ValueError), match=re.escape(says)):
        build(**overrides)


def test_the_right_values_of_every_key_are_taken() -> None:
    app, ext = build(
        {
            "BREAKER_KEY_PREFIX": "shop.v2",
            "BREAKER_DEFAULTS": {"failure_threshold": 2},
            "BREAKER_ROUTES": {"/pay": "pay"},
            "BREAKER_ON_STORE_ERROR": "deny",
            "BREAKER_ADMIN_TOKEN": "s3cret",
            "BREAKER_DASHBOARD": True,
        }
    )
    with app.app_context():
        assert ext.breakers.prefix == "shop.v2"
        assert ext.breaker("pay").config.failure_threshold == 2
        assert ext.breakers.gate.policy == "deny"
    assert "breaker_redis.dashboard" in app.view_functions
    ext.breakers.close()
    _app, off = build({"BREAKER_ADMIN_TOKEN": ""})  # empty: not set, no admin endpoints
    assert "breaker_redis.status" not in _app.view_functions
    off.breakers.close()


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("BREAKER_REDIS_ULR", "did you mean BREAKER_REDIS_URL?"),
        ("BREAKER_DASBOARD", "did you mean BREAKER_DASHBOARD?"),
        ("BREAKER_ADMIN_TOKN", "did you mean BREAKER_ADMIN_TOKEN?"),
        ("BREAKER_ROUTE", "did you mean BREAKER_ROUTES?"),
        (
            "BREAKER_XYZZY",
            "known: BREAKER_REDIS_URL, BREAKER_KEY_PREFIX, BREAKER_DEFAULTS, BREAKER_ROUTES, "
            "BREAKER_ON_STORE_ERROR, BREAKER_ADMIN_TOKEN, BREAKER_DASHBOARD, BREAKER_REPORTER",
        ),
    ],
)
def test_an_unknown_breaker_key_is_a_warning_naming_the_closest_key(caplog, key, hint) -> None:
    caplog.set_level(logging.WARNING, logger="breaker_redis")
    app, ext = build({key: "redis://10.0.0.7:6379/0", "BREAKER_KEY_PREFIX": "shop", "SECRET_KEY": "x"})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"app.config[{key!r}] is not a breaker_redis setting and is ignored; {hint}"]
    with app.app_context():
        assert ext.breakers.prefix == "shop"  # the app still starts, with what it was given
    ext.breakers.close()


def test_known_keys_give_no_warning(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="breaker_redis")
    _app, ext = build(
        {"BREAKER_KEY_PREFIX": "x", "BREAKER_ON_STORE_ERROR": "allow", "BREAKER_DEFAULTS": None}
    )
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    ext.breakers.close()


def test_a_declaration_after_init_app_is_checked_when_declared() -> None:
    """FlaskBreakers() then init_app(app): a protect() written after it (in a blueprint
    imported later) is checked over the app's BREAKER_DEFAULTS at once."""
    ext = FlaskBreakers(client=fakeredis.FakeRedis(), listen=False)
    app = Flask(__name__)
    app.config["BREAKER_DEFAULTS"] = {"max_open_seconds": 60}
    ext.init_app(app)
    with pytest.raises(ValueError, match=re.escape("protect('pay'): BreakerConfig.max_open_seconds must be")):
        ext.protect("pay", open_seconds=120)
    with pytest.raises(ValueError, match=re.escape("outbound('stock'): BreakerConfig.failure_threshold")):
        ext.outbound("stock", failure_threshold=0)
    with pytest.raises(ValueError, match=re.escape("protect('my pay'): invalid breaker name 'my pay'")):
        ext.protect("my pay")
    with pytest.raises(ValueError, match=re.escape("outbound('a b'): invalid breaker name")):
        ext.outbound("a b")
    with app.app_context(), pytest.raises(ValueError, match=re.escape("breaker('a b'): invalid breaker")):
        ext.breaker("a b", failure_threshold=2)
    ext.protect("pay", open_seconds=30)  # a good one is declared
    with app.app_context():
        assert ext.breaker("pay").config.open_seconds == 30


def test_a_declaration_before_init_app_is_checked_at_init_app_naming_it() -> None:
    ext = FlaskBreakers(client=fakeredis.FakeRedis(), listen=False)
    ext.protect("pay", open_seconds=120)  # fine over the default defaults
    app = Flask(__name__)
    app.config["BREAKER_DEFAULTS"] = BreakerConfig(max_open_seconds=60)
    with pytest.raises(ValueError, match=re.escape("protect('pay'): BreakerConfig.max_open_seconds")):
        ext.init_app(app)
