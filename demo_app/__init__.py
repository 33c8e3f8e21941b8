"""The breaker_redis demo: a Flask shop behind gunicorn, a flaky upstream, and a runner.

- ``python -m demo_app``: start everything, drive traffic through
  healthy -> failing -> open -> half_open -> recovered, print the timeline.
- ``python -m demo_app.upstream --port P``: the flaky upstream on its own.
- ``demo_app.app:app``: the WSGI app; ``demo_app/gunicorn.conf.py``: 4 workers.
"""
