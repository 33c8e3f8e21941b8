"""Runs one Python block of the docs as ``python block.py`` would, then drives the app it defines.

``python tests/support/docs_runner.py BLOCK REPORT``: tests/system/test_docs.py starts one
fresh interpreter per block. The block's text is compiled exactly as written
and run as the ``__main__`` module of this interpreter (a fresh namespace:
``__name__ == "__main__"``, ``sys.argv[0]`` and ``sys.path[0]`` are the
block's file, as for a script), so a module that names itself, such as
Django's ``ROOT_URLCONF=__name__``, imports that very namespace. Nothing of
this file is visible to the block.

Then, if the block left a web app in ``application`` (what gunicorn serves)
or else ``app``, every route it defines is called ``CALLS`` times through a
test client in this process, and REPORT gets JSON: the app's kind and, per
``"METHOD /path"``, the answers as ``[status, X-Breaker header or None]``.
The test judges them; this file only collects.

Routes are found the way each kind of app lists them: Flask's ``url_map``,
Starlette's and FastAPI's ``routes``, Django's URL resolver, and the route
prefixes of breaker_redis's WSGI and ASGI middlewares (with the routes of
the app they wrap). Routes with path parameters are left out (there is no
value to call them with). A Flask, WSGI or Django app is called through
Werkzeug's test client; an ASGI app through Starlette's, its lifespan run.
"""

from __future__ import annotations

import builtins
import inspect
import json
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Calls per route: more than the 5 failures the examples' breakers trip on, so
# a view that fails is seen answering as the breaker makes it answer after a trip.
CALLS = 8
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

Call = Callable[[str, str], tuple[int, str | None]]


def run_block(path: Path) -> dict[str, Any]:
    """Run the block as the ``__main__`` module; its namespace afterwards."""
    module = types.ModuleType("__main__")
    module.__file__ = str(path)
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.argv = [str(path)]
    sys.path[0] = str(path.parent)
    code = compile(path.read_text("utf-8"), str(path), "exec", dont_inherit=True)
    exec(code, module.__dict__)
    return module.__dict__


def routes_of(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route the app defines that takes no path parameter."""
    from breaker_redis import asgi, wsgi

    found: dict[str, set[str]] = {}
    if isinstance(app, (wsgi.BreakerMiddleware, asgi.BreakerMiddleware)):
        for method, path in routes_of(app.app):
            found.setdefault(path, set()).add(method)
        for prefix, _spec in app.routes:
            found.setdefault(prefix, {"GET"})
    elif hasattr(app, "url_map"):  # Flask
        for rule in app.url_map.iter_rules():
            if rule.endpoint != "static" and not rule.arguments:
                found.setdefault(rule.rule, set()).update(rule.methods or ())
    elif _is_django(app):
        from django.urls import get_resolver
        from django.urls.resolvers import URLPattern

        for pattern in get_resolver().url_patterns:
            route = str(pattern.pattern)
            if isinstance(pattern, URLPattern) and "<" not in route:
                found.setdefault("/" + route.lstrip("^").rstrip("$"), set()).update(METHODS[:2])
    elif hasattr(app, "routes"):  # Starlette, FastAPI
        for route in app.routes:
            path, methods = getattr(route, "path", ""), getattr(route, "methods", None)
            if path and "{" not in path and methods:
                found.setdefault(path, set()).update(methods)
    routes = []
    for path, methods in sorted(found.items()):
        method = next((m for m in METHODS if m in methods), None)
        if method is not None:
            routes.append((method, path))
    return routes


def _is_django(app: Any) -> bool:
    return type(app).__module__.startswith("django.")


def _is_asgi(app: Any) -> bool:
    """An ASGI app is called with (scope, receive, send) and awaited; a WSGI app is not awaited."""
    from breaker_redis import asgi

    if isinstance(app, asgi.BreakerMiddleware):
        return True
    call = app if inspect.isfunction(app) else type(app).__call__
    return inspect.iscoroutinefunction(call)


@contextmanager
def client_for(app: Any) -> Iterator[tuple[str, Call]]:
    """(kind of app, call(method, path) -> (status, X-Breaker))."""
    if _is_asgi(app):
        with warnings.catch_warnings():  # the harness's own import, not the block's: Starlette
            warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")  # asks for httpx2
            from starlette.testclient import TestClient

        with TestClient(app, raise_server_exceptions=False) as client:

            def call_asgi(method: str, path: str) -> tuple[int, str | None]:
                answer = client.request(method, path)
                return answer.status_code, answer.headers.get("X-Breaker")

            yield "asgi", call_asgi
        return
    from werkzeug.test import Client

    kind = "flask" if hasattr(app, "url_map") else "django" if _is_django(app) else "wsgi"
    wsgi_client = Client(app)

    def call_wsgi(method: str, path: str) -> tuple[int, str | None]:
        answer = wsgi_client.open(path, method=method)
        try:
            return answer.status_code, answer.headers.get("X-Breaker")
        finally:
            answer.close()

    yield kind, call_wsgi


def drive(namespace: dict[str, Any]) -> dict[str, Any]:
    app = namespace.get("application", namespace.get("app"))
    if app is None or not callable(app):
        return {"app": None, "answers": {}}
    answers: dict[str, list[tuple[int, str | None]]] = {}
    with client_for(app) as (kind, call):
        for method, path in routes_of(app):
            answers[f"{method} {path}"] = [call(method, path) for _ in range(CALLS)]
    return {"app": kind, "answers": answers}


def main() -> None:
    block, report = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    namespace = run_block(block)
    report.write_text(json.dumps(drive(namespace)), "utf-8")


if __name__ == "__main__":
    main()
