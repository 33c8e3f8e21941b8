"""The keys check: how many breakers the prefix holds and what one costs in memory."""

from __future__ import annotations

import random

import redis

from breaker_redis.ops.doctor.checkup import OK, Checkup, Lines, count
from breaker_redis.ops.doctor.permissions import PROBE_MEMBER
from breaker_redis.storage import acl
from breaker_redis.storage.eviction import size
from breaker_redis.storage.keys import breaker_keys
from breaker_redis.storage.scripts import text

MEMORY_SAMPLE = 20  # breakers whose keys MEMORY USAGE measures


def check_keys(up: Checkup) -> Lines:
    names_key = up.scripts.names_key
    names = sorted(n for n in map(text, up.client.smembers(names_key)) if n != PROBE_MEMBER)
    if not names:
        return [(OK, f"no breakers under prefix {up.prefix!r} yet ({names_key} is empty)")]
    pipe = up.client.pipeline(transaction=False)
    for name in names:
        pipe.exists(breaker_keys(up.prefix, name)[0])  # its state
    with_state = [name for name, found in zip(names, pipe.execute(), strict=True) if found]
    line = f"{count(len(names), 'breaker')} listed in {names_key}, {len(with_state)} with a state"
    sample = random.sample(with_state, min(MEMORY_SAMPLE, len(with_state)))
    if not sample:
        return [(OK, line)]
    try:
        total = sum(up.client.memory_usage(key) or 0 for n in sample for key in breaker_keys(up.prefix, n))
    except redis.exceptions.ResponseError as exc:
        if acl.missing_rule(exc, up.prefix) is None:
            raise
        return [(OK, f"{line}; memory per breaker not measured: user {up.who} may not run MEMORY USAGE")]
    return [
        (
            OK,
            f"{line}; about {size(total / len(sample))} per breaker (MEMORY USAGE of the keys of "
            f"{len(sample)})",
        )
    ]
