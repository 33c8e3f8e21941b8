"""Many calls of one script at once, for reading many breakers (ops/reader.py: the
status command, the metrics): in one pipeline, and on one server the next chunk
sent before this one's replies are decoded.

Sync only, as the readers are. What each call sends is the runner's
(``Scripts.commands``); a call that found its script missing (a new, restarted
or flushed server: every call of the pipeline) is sent again in one more
pipeline once the script is loaded, and one that misses it even then runs alone
(``ScriptRunner.run``, whose steps mend whatever can be mended).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterable, Sequence
from typing import Any, Protocol

import redis

from breaker_redis.storage.internals import pooled_connection, send_commands

Call = tuple[str, "int | None", Sequence[Any]]  # name, now_ms, args: one script call (run_many)


class ScriptRunner(Protocol):
    """What is used here of scripts.ScriptRunner, which calls this module (run_many):
    named by its shape, as the runner's module imports this one."""

    client: Any
    use_functions: bool
    library: str
    heads: dict[str, tuple[str, ...]]

    def commands(self, operation: str, calls: Sequence[Call]) -> list[tuple[Any, ...]]: ...
    def missing(self, result: Any) -> bool: ...
    def run(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any: ...
    def load_failed(self, exc: redis.exceptions.ResponseError) -> None: ...


def run_many(runner: ScriptRunner, operation: str, calls: Sequence[Call]) -> list[Any]:
    """Calls of one script, each (name, now_ms, args), in one pipeline (on a
    cluster, redis-py's sends one per node): each call's reply, or the
    ResponseError it got, in order."""
    return _loaded(runner, operation, calls, _pipelined(runner, operation, calls))


def run_chunks(
    runner: ScriptRunner, operation: str, chunks: Iterable[Sequence[Call]]
) -> Generator[list[Any], None, None]:
    """run_many() of each chunk in turn, except that on one server the next
    chunk is sent before this one's replies are handed over: Redis runs it
    while the caller decodes these (a third less time for 2,000 breakers read,
    bench/status.py). Two chunks at most are in flight, on one connection of
    the client's pool, which is dropped if the caller stops before the end
    (replies would be left in it). A cluster's chunks go one after the other."""
    if not isinstance(runner.client, redis.Redis):
        for calls in chunks:
            yield run_many(runner, operation, calls)
        return
    pool = runner.client.connection_pool
    conn = pooled_connection(pool)
    sent: deque[Sequence[Call]] = deque()
    drained = False
    try:
        for calls in chunks:
            send_commands(conn, runner.commands(operation, calls))  # packed once per distinct argument
            sent.append(calls)
            if len(sent) == 2:
                done = sent.popleft()
                yield _loaded(runner, operation, done, _replies(conn, len(done)))
        while sent:
            done = sent.popleft()
            yield _loaded(runner, operation, done, _replies(conn, len(done)))
        drained = True
    finally:
        if not drained:
            conn.disconnect()
        pool.release(conn)


def _replies(conn: Any, count: int) -> list[Any]:
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(conn.read_response())
        except redis.exceptions.ResponseError as exc:
            replies.append(exc)
    return replies


def _loaded(runner: ScriptRunner, operation: str, calls: Sequence[Call], results: list[Any]) -> list[Any]:
    """The results of calls, those that found the script missing sent again once it is loaded."""
    missing = [i for i, result in enumerate(results) if runner.missing(result)]
    if not missing:
        return results
    _load(runner, operation)
    again = _pipelined(runner, operation, [calls[i] for i in missing])
    for i, result in zip(missing, again, strict=True):
        results[i] = runner.run(operation, *calls[i]) if runner.missing(result) else result
    return results


def _pipelined(runner: ScriptRunner, operation: str, calls: Sequence[Call]) -> list[Any]:
    pipe = runner.client.pipeline(transaction=False)
    for command in runner.commands(operation, calls):
        pipe.execute_command(*command)
    return list(pipe.execute(raise_on_error=False))


def _load(runner: ScriptRunner, operation: str) -> None:
    if runner.use_functions:
        try:
            runner.client.function_load(runner.library)
        except redis.exceptions.ResponseError as exc:
            runner.load_failed(exc)
    else:
        runner.client.script_load(runner.heads[operation][-1])
