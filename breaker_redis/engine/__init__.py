"""The engine: a worker's side of the shared state machine.

A breaker's configuration, what a worker knows of its state, the call paths
(guard, permit, decorate), batching outcomes, refusals and transitions. It
decides; the scripts in ``breaker_redis.storage`` carry out each decision in
Redis. The public names are re-exported by ``breaker_redis`` itself.
"""
