"""Flask apps with one FlaskBreakers on fakeredis, for the tests of the extension."""

from __future__ import annotations

import fakeredis
from flask import Flask

from breaker_redis.flask import FlaskBreakers


def make_app(clock, server=None, *, config=None, testing=False, **overrides):
    """An app with one extension on a fakeredis server (shared when given: a second
    app on the same server is another worker)."""
    app = Flask(__name__)
    app.testing = testing
    app.config.update(config or {})
    overrides.setdefault("client", fakeredis.FakeRedis(server=server or fakeredis.FakeServer()))
    overrides.setdefault("clock", clock)
    overrides.setdefault("listen", False)
    return app, FlaskBreakers(app, **overrides)
