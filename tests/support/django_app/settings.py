"""Minimal settings: no database, no installed apps, no Django middleware.

No CSRF middleware, so the tests can POST /pay without a token; DEBUG off,
so a view that raised would be a plain 500 page, which the tests forbid.
"""

SECRET_KEY = "breaker-redis-tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "tests.support.django_app.urls"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
