"""The optional dependencies: a module that needs one names the extra that brings it.

Each integration's dependency is an extra (pyproject.toml, docs/install.md),
so ``import breaker_redis`` and the command line need none of them; a module
imported without its extra fails with the pip command that fixes it.
"""

from __future__ import annotations


def missing(module: str, package: str, extra: str, error: ImportError) -> ImportError:
    """What ``module`` raises when ``package`` (``error``: its failed import) is not installed."""
    return ImportError(f"{module} needs {package}: pip install 'breaker-redis[{extra}]'", name=error.name)
