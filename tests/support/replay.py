"""One set of hypothesis settings for the tests whose examples drive servers."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def replayed(max_examples: int, *, fixtures: bool = True) -> settings:
    """Settings whose examples are the same in every run (derandomized, no example
    database), so a failure in CI is one anyone reproduces; no deadline and no size
    or speed health checks, since each example drives real servers. ``fixtures``: the
    test's function-scoped fixtures are shared by its examples on purpose (a server
    started once)."""
    checks = [HealthCheck.too_slow, HealthCheck.data_too_large]
    if fixtures:
        checks.insert(0, HealthCheck.function_scoped_fixture)
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=checks,
    )
