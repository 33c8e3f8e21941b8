"""One sick host under gunicorn (docs/one-sick-host.md): two gunicorn instances of
the demo app (4 workers each) with different BREAKER_REPORTER on one redis-server,
/pay's breaker asking for failures from 2 reporters. The first instance's payment
service fails, the second's is healthy: after exactly 5 failures every worker of the
first answers 503 `isolated` with Retry-After, the second keeps answering 200, and
the shared state stays closed. Every wait is a condition with a deadline.
"""

from __future__ import annotations

import pytest
import requests

from demo_app import stack

pytestmark = [pytest.mark.real, pytest.mark.multiprocess]


def test_the_sick_instance_is_isolated_and_the_other_keeps_answering(redis_server):
    children = []
    try:
        sick_upstream, child = stack.start_upstream()
        children.append(child)
        well_upstream, child = stack.start_upstream()
        children.append(child)
        requests.post(sick_upstream + "/_control", json={"fail_rate": 1.0}, timeout=5).raise_for_status()
        env = {"BREAKER_KEY_PREFIX": "quorum", "DEMO_PAY_MIN_REPORTERS": "2", "DEMO_PAY_OPEN_SECONDS": "30"}
        apps = []
        for upstream, reporter in ((sick_upstream, "a"), (well_upstream, "b")):
            with_reporter = {**env, "BREAKER_REPORTER": reporter}
            app, child = stack.start_gunicorn(redis_server.url, upstream, env=with_reporter)
            apps.append(app)
            children.append(child)
        first, second = apps

        def pay(app: str) -> requests.Response:
            return requests.post(app + "/pay", headers={"Accept": "application/json"}, timeout=10)

        assert [pay(first).status_code for _ in range(5)] == [502] * 5
        refused = [pay(first) for _ in range(20)]
        assert {(r.status_code, r.headers.get("X-Breaker-Reason")) for r in refused} == {(503, "isolated")}
        assert {int(r.headers["Retry-After"]) for r in refused} <= set(range(1, 31))
        assert [pay(second).status_code for _ in range(20)] == [200] * 20
        hits = requests.get(sick_upstream + "/_stats", timeout=5).json()["hits"]
        assert hits.get("/pay") == 5
        client = redis_server.client()
        assert client.hget("quorum:{pay}:state", "state") == b"closed"
        assert client.hget("quorum:{pay}:stats", "isolations") == b"1"
    finally:
        for child in reversed(children):
            child.stop()
            child.remove_log()
