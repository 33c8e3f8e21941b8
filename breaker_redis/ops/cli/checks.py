"""``doctor`` and ``metrics``: the Redis checked for what the breakers need, and
the breakers' Prometheus exposition, printed once or served."""

from __future__ import annotations

import click

from breaker_redis.ops.cli.group import Target, main, pass_target

_DOCTOR_COLOURS = {"OK": "green", "NOTE": "cyan", "SKIP": "cyan", "WARN": "yellow", "PROBLEM": "red"}


@main.command()
@pass_target
def doctor(target: Target) -> None:
    """Check the Redis the breakers use, before the users find out.

    Server version and Redis Functions, topology (standalone, replica,
    Sentinel, Cluster), maxmemory-policy, the ACL permissions the engine needs
    (each command sent once; only PREFIX:health and the names set are written,
    and left as they were), pub/sub ordering, round-trip latency, and the keys
    with their memory per breaker.

    The report goes to stdout, a line per check. Exit codes: 0 nothing wrong;
    1 a PROBLEM line for each problem, saying what to do (a Redis that cannot
    be reached is one line).
    """
    from breaker_redis.ops.doctor import diagnose

    report = diagnose(target.client, target.prefix, target.where)
    for line in report.lines(lambda status, word: click.style(word, fg=_DOCTOR_COLOURS.get(status))):
        click.echo(line)
    if report.problems:
        raise click.exceptions.Exit(1)


@main.command()
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve the exposition at http://HOST:PORT/metrics until Ctrl-C, instead of printing it once.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to serve on, with --port.")
@pass_target
def metrics(target: Target, port: int | None, host: str) -> None:
    """Prometheus metrics of every breaker, read from Redis (all workers of all hosts).

    Names: breaker_redis_state, _forced, _calls_total, _slow_calls_total,
    _rejected_total, _trips_total, _window_calls, _window_failures,
    _retry_after_seconds (see breaker_redis.metrics).
    """
    try:
        from breaker_redis.metrics import BreakerCollector, exposition
    except ImportError as missing:  # prometheus-client is optional: the message names the extra
        raise click.ClickException(str(missing)) from missing
    from prometheus_client import CollectorRegistry, start_http_server

    target.names()  # Redis unreachable: exit 1 now, not an exposition saying breaker_redis_up 0
    if port is None:
        click.echo(exposition(target.client, target.prefix, target.clock).decode(), nl=False)
        return
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BreakerCollector(target.client, target.prefix, target.clock))
    server, _ = start_http_server(port, addr=host, registry=registry)
    click.echo(f"serving http://{host}:{port}/metrics (Ctrl-C stops)")
    try:
        while True:
            target.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
