"""breaker-redis: every breaker in one Redis at a glance, and an operator's switches.

    breaker-redis [--url URL] [--prefix P] COMMAND [ARGS]...   (the options may follow COMMAND too)
    flask breakers COMMAND [ARGS]...     (the same commands, on the app's Redis and prefix)

Reads go through the snapshot script (for many breakers its twin
lua/read.lua, pipelined: reader.py), so what is shown is what the workers
decide by; switches run the same admin and configure scripts as
``Breaker.force_open()`` and ``Breakers.configure()``, each followed by the
barrier round trip, so every worker (one deciding from memory too) hears of
the change before its next call.

The window is read with the bucket width and count the workers last wrote
(``bms`` and ``nb`` in the window hash): the CLI does not know the apps'
configs, and a window read with another bucket width reads as empty.

Exit codes a script can rely on: 0 done; 1 Redis unreachable, a Redis
error, or an unknown breaker (for ``show`` and the switches); 2 a usage or
validation error (nothing was written). Messages go to stderr.

The modules: group (the options, the Target, exit codes), formatting (the
table and lines), overview (status, watch), detail (show), switches (open,
close, auto, reset, config), following (events), checks (doctor, metrics).
None imports Flask: ``breaker_redis.flask`` registers the same commands on
``flask`` with ``command_group``.
"""

from __future__ import annotations

# Each command module registers its commands on ``main`` when imported.
from breaker_redis.ops.cli import checks, detail, following, overview, switches
from breaker_redis.ops.cli.formatting import group_line, state_label, table, transition_line
from breaker_redis.ops.cli.group import (
    DEFAULT_PREFIX,
    DEFAULT_URL,
    TIMEOUT,
    Failed,
    Invalid,
    MainGroup,
    OperationsGroup,
    Target,
    _timeouts,
    command_group,
    group_options_first,
    main,
    pass_target,
)

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_URL",
    "TIMEOUT",
    "Failed",
    "Invalid",
    "MainGroup",
    "OperationsGroup",
    "Target",
    "_timeouts",
    "checks",
    "command_group",
    "detail",
    "following",
    "group_line",
    "group_options_first",
    "main",
    "overview",
    "pass_target",
    "state_label",
    "switches",
    "table",
    "transition_line",
]
