"""gunicorn config of the demo: 4 workers, each with its own view of one shared breaker.

``gunicorn -c demo_app/gunicorn.conf.py`` serves ``demo_app.app:app``;
command-line flags (``-b``, ``-k gthread --threads 4``, ``--preload``) win
over what is written here.
"""

import os

wsgi_app = "demo_app.app:app"
bind = os.environ.get("DEMO_BIND", "127.0.0.1:8000")
workers = 4
worker_class = "sync"
timeout = 30
# Short, so that stopping the demo never waits long on a worker.
graceful_timeout = 3
loglevel = "warning"
accesslog = None
