"""``flask breakers ...``: the ``breaker-redis`` commands on the app's Redis and prefix.

The commands are breaker_redis.ops.cli's own; only where they act differs: the
Redis client and key prefix of the app's ``FlaskBreakers`` (from
``BREAKER_REDIS_URL`` / ``BREAKER_KEY_PREFIX``, or the ``client=`` /
``breakers=`` the extension was given), read inside the app context, and the
breakers the app declares (``protect``, ``breaker``, ``outbound``,
``BREAKER_ROUTES``) count as known before their first call, as they do for
the admin endpoints.
"""

from __future__ import annotations

from typing import cast

import click
from flask import current_app
from flask.cli import with_appcontext

from breaker_redis.flask.state import EXTENSION_KEY, AppState
from breaker_redis.ops.cli import Target, command_group


def _app_target() -> Target:
    state = current_app.extensions.get(EXTENSION_KEY)
    if state is None:
        raise click.ClickException("FlaskBreakers.init_app(app) was not called for this app")
    app_state = cast(AppState, state)
    breakers = app_state.breakers
    # The breakers the app declares are known before their first call, as to its admin endpoints.
    return Target(breakers.client, breakers.prefix, owns_client=False, declared=app_state.app_names())


def breakers_group() -> click.Group:
    return command_group(
        "breakers",
        _app_target,
        wrap=with_appcontext,
        help="Show and switch this app's circuit breakers (the breaker-redis commands).\n\n"
        "Exit codes: 0 done; 1 Redis unreachable, a Redis error or an unknown breaker; "
        "2 a usage or validation error (nothing was written).",
    )
