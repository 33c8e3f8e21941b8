"""The base layer: what the stores and the engine both stand on.

A breaker's configuration (config.py, its live fields in fields.py), the
refusal callers catch (errors.py), the rule of a breaker's name (names.py)
and the process's background threads (background.py). The stores need each
of them as much as the engine does, so none may live in either: under
``engine/`` they made the stores import the engine that imports them, one
import cycle through both. Nothing here imports the rest of breaker_redis
(tests/system/test_layers.py checks it; docs/design.md, section 1, draws the
layers). The public names are re-exported by ``breaker_redis`` itself.
"""
