"""Two views: ``/pay`` calls the upstream (demo_app.upstream, which the tests make
fail, hang or succeed), ``/products`` answers locally.

``/pay`` answers 502 when the upstream fails and 504 when it cannot be
reached: Django turns an exception escaping a view into its own 500 page
before any WSGI middleware sees it, so a view that wants its failures
counted answers them with a status (5xx is a failure by default).
"""

from __future__ import annotations

import os
import threading

import requests
from django.http import HttpRequest, JsonResponse

UPSTREAM_URL = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8081").rstrip("/")
# Longer than any hang the tests hold a probe in.
UPSTREAM_TIMEOUT = float(os.environ.get("DJANGO_UPSTREAM_TIMEOUT", "30"))
_local = threading.local()


def session() -> requests.Session:
    """One keep-alive session per worker thread, made after the fork."""
    current = getattr(_local, "session", None)
    if current is None:
        current = _local.session = requests.Session()
    return current


def pay(request: HttpRequest) -> JsonResponse:
    try:
        answer = session().post(UPSTREAM_URL + "/pay", timeout=UPSTREAM_TIMEOUT)
    except requests.RequestException as exc:
        return JsonResponse({"ok": False, "error": type(exc).__name__}, status=504)
    if answer.status_code >= 500:
        return JsonResponse({"ok": False, "upstream_status": answer.status_code}, status=502)
    return JsonResponse({"ok": True, "upstream": answer.json()})


def products(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"items": ["oolong", "matcha whisk", "gaiwan"]})
