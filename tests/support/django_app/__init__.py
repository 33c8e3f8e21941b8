"""A small Django project served by gunicorn behind breaker_redis.wsgi.BreakerMiddleware
(tests/system/test_wsgi_django.py): no database, no installed apps, two views."""
