"""The Redis plumbing: scripts, clients and topologies.

Loading and running the Lua scripts (FCALL or EVALSHA, NOSCRIPT handled), the
local store used while Redis is down, clients for one server, Sentinel and
Cluster, pub/sub invalidation, sharded subscriptions and ACL checks. Nothing
here decides a breaker's state: the Lua files in ``lua/`` do.
"""
