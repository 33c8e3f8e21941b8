"""The docs run: every ```python block of README.md and docs/*.md, exactly as written.

The rules of this harness (CONTRIBUTING.md, "The docs", says the same in a line):

1. Every block fenced as ```python runs alone, in a fresh interpreter, as
   the ``__main__`` module of a fresh namespace, as ``python example.py``
   would run it (tests/support/docs_runner.py); no text inside a block is changed,
   and no block sees another's names. Blocks fenced otherwise (``sh``,
   ``text``, ``ini``, none) are not run, so a command that starts a
   long-running server (gunicorn, uvicorn) belongs in a ``sh`` block; a
   fence whose language starts with ``py`` must be exactly ``python``.
2. Its environment: ``BREAKER_REDIS_URL`` is a real redis-server this module
   starts (one for all blocks, emptied before each block; the URL asks for a 0.9 s
   client timeout, the longest the product allows, so that a stall of a busy
   test machine does not send a block to its local breakers), ``UPSTREAM_URL``
   demo_app's flaky upstream (``python -m demo_app.upstream``), healthy, and
   ``PYTEST_PLUGINS`` the testing kit's pytest plugin, which installing the product
   registers (a block that runs pytest finds its fixtures even in a checkout whose
   install predates the entry point; tests/system/test_packaging.py holds the wheel
   to registering it). An
   example reads them with ``os.environ.get(NAME, default)``; a quoted
   ``redis://`` URL may appear only as the default of
   ``os.environ.get("BREAKER_REDIS_URL", ...)``, and a block that reads
   ``BREAKER_REDIS_URL`` must have connected to the suite's server.
3. It runs twice in a row on the same server, emptied only before the first
   run: a user runs an example again, so it must leave nothing behind that
   changes what it does the second time (a breaker left open or forced
   under a name it calls), and after both runs no live override and no
   force of its making is left in Redis, where a user's own breakers of the
   same name would obey it. Each run must exit 0 within ``TIMEOUT`` seconds
   and write nothing to stderr: a warning or a logged error fails it
   (breakers that could not reach Redis and went on locally, an
   ``on_transition`` callback that raised).
4. If it leaves a web app in ``application`` or ``app`` (Flask, FastAPI,
   Starlette, Django, any WSGI or ASGI callable), every route it defines
   without path parameters is called ``docs_runner.CALLS`` times through a
   test client. The first answer of every route is below 500 (the breakers
   start closed and the stand-in services healthy, so a broken view shows
   there), and every answer is below 500, a 502 (the example's own answer to
   a failing service) or a 503 refusal carrying ``X-Breaker``. A view that
   is a 500 cannot come back.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs_runner import CALLS
from tests.support.plugin_user import PLUGIN
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "support" / "docs_runner.py"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT = 60
FENCE = re.compile(r"^```(\S*)\s*$")
URL_LITERAL = re.compile(r"""(["'])rediss?(\+\w+)?://[^"']*\1""")
URL_DEFAULT = 'os.environ.get("BREAKER_REDIS_URL", '


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    found, language, start, lines = [], None, 0, []
    for number, line in enumerate(doc.read_text("utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if language is None:
            if fence:
                language, start, lines = fence.group(1), number, []
        elif line.strip() == "```":
            found.append(Block(doc, start, language, "\n".join(lines) + "\n"))
            language = None
        else:
            lines.append(line)
    assert language is None, f"{doc.name}: the block opened on line {start} is never closed"
    return found


ALL = [block for doc in DOCS for block in blocks(doc)]
PYTHON = [block for block in ALL if block.language == "python"]


def test_the_blocks_are_found():
    """Every doc is read, and a Python block cannot hide behind another fence."""
    assert {block.doc.name for block in PYTHON} >= {
        "README.md",
        "asgi.md",
        "asyncio.md",
        "flask.md",
        "getting-started.md",
        "one-sick-host.md",
        "operations.md",
        "pybreaker-migration.md",
        "testing.md",
        "usage.md",
        "wsgi.md",
    }
    hidden = [
        block.id for block in ALL if block.language.lower().startswith("py") and block.language != "python"
    ]
    assert hidden == []


@pytest.mark.parametrize("block", PYTHON, ids=lambda block: block.id)
def test_redis_urls_come_from_the_environment(block: Block):
    for match in URL_LITERAL.finditer(block.text):
        before = block.text[: match.start()]
        why = f"{block.id}: {match.group(0)} is not the default of BREAKER_REDIS_URL"
        assert before.endswith(URL_DEFAULT), why


@pytest.fixture(scope="module")
def redis_for_docs() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


RUNS = 2  # rule 3: an example runs again as it ran the first time


@pytest.mark.parametrize("block", PYTHON, ids=lambda block: block.id)
def test_block_runs(block: Block, redis_for_docs: RedisServer, upstream_url: str, tmp_path: Path):
    client = redis_for_docs.client()
    client.flushall()  # before the first run only: the second finds what the first left
    script = tmp_path / "example.py"
    script.write_text(block.text, "utf-8")
    env = {key: value for key, value in os.environ.items() if not key.startswith("BREAKER_")}
    # a generous client timeout: the blocks show the product's behaviour, not how it copes when a
    # busy test machine stalls a reply past the default 0.25 s (it then goes on locally and says
    # so on stderr, which fails the block: rule 3)
    url = redis_for_docs.url + "?socket_timeout=0.9&socket_connect_timeout=0.9"
    env.update(BREAKER_REDIS_URL=url, UPSTREAM_URL=upstream_url, PYTEST_PLUGINS=PLUGIN)
    for run in range(1, RUNS + 1):
        connections = client.info("stats")["total_connections_received"]
        report = tmp_path / f"report-{run}.json"
        done = subprocess.run(
            [sys.executable, str(RUNNER), str(script), str(report)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        shown = f"{block.id}, run {run} of {RUNS}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        assert (done.returncode, done.stderr) == (0, ""), shown

        if "BREAKER_REDIS_URL" in block.text:  # this test's own client connected before the count
            assert client.info("stats")["total_connections_received"] > connections, shown
        result = json.loads(report.read_text("utf-8"))
        for route, answers in result["answers"].items():
            assert len(answers) == CALLS
            first, _ = answers[0]
            assert first < 500, f"{block.id}, run {run} {route}: {answers}"
            wrong = [
                (status, breaker)
                for status, breaker in answers
                if status >= 500 and status != 502 and not (status == 503 and breaker)
            ]
            assert wrong == [], f"{block.id}, run {run} {route}: {answers}"
        if re.search(r"^(app|application)\s*=", block.text, re.MULTILINE):
            assert result["answers"], f"{block.id}, run {run}: an app with no route was driven: {result}"
    # rule 3: what a user would find in their own Redis after running it
    assert left_behind(client) == [], f"{block.id}: live overrides or forces left behind"


def left_behind(client: Any) -> list[str]:
    """The breakers' live overrides (``<prefix>:{NAME}:config``) and forces in Redis."""
    found = []
    for raw in client.scan_iter(match="*"):
        key = raw.decode() if isinstance(raw, bytes) else raw
        if client.type(raw) not in (b"hash", "hash"):
            continue
        if key.endswith(":config") and client.hlen(raw):
            found.append(f"{key}: {client.hgetall(raw)}")
        elif key.endswith(":state") and client.hget(raw, "forced") not in (None, b"", ""):
            found.append(f"{key}: forced {client.hget(raw, 'forced')}")
    return sorted(found)
