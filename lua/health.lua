-- health.lua: can this server run the breakers' scripts now? The store gate
-- runs it while Redis is considered unavailable (breaker_redis/storage/store.py), and
-- `breaker-redis doctor` runs it to check the permissions: it calls every
-- command the other scripts call, on one key of its own, so it fails exactly
-- when they would (out of memory, read-only, busy, or a Redis ACL user that
-- lacks a command, the key pattern or the channel; tests/storage/test_acl.py keeps
-- its command list equal to theirs).
--
-- KEYS  : 1 the health key, <prefix>:health (outside every breaker's hash tag), or on Redis
--         Cluster <prefix>:{NAME}:health, in the slot of a breaker whose master is probed
-- ARGV  : 1-4 common (see _lib.lua; 5 and 6 unused)
-- Reads and writes only the health key, which it leaves as a string expiring
-- after 60 s; publishes one message naming no breaker (listeners drop it).
-- Returns 1.
local key = KEYS[1]
redis.call('DEL', key)
redis.call('EXISTS', key)
redis.call('HSET', key, 'f1', 1, 'f2', 2)
redis.call('HMGET', key, 'f1', 'f2')
redis.call('HGET', key, 'f1')
redis.call('HGETALL', key)
redis.call('HINCRBY', key, 'f1', 1)
redis.call('HDEL', key, 'f2')
redis.call('DEL', key)
redis.call('ZADD', key, NOW, 'm')
redis.call('ZSCORE', key, 'm')
redis.call('ZCARD', key)
redis.call('ZRANGE', key, 0, -1)
redis.call('ZRANGEBYSCORE', key, '-inf', NOW)
redis.call('ZREM', key, 'm')
redis.call('ZREMRANGEBYSCORE', key, '-inf', NOW)
redis.call('DEL', key)
redis.call('LPUSH', key, 'e')
redis.call('LTRIM', key, 0, 0)
redis.call('LINDEX', key, 0)
redis.call('DEL', key)
redis.call('SET', key, NOW)
redis.call('GET', key)
redis.call('SETRANGE', key, 0, '0')
redis.call('GETRANGE', key, 0, 0)
redis.call('PERSIST', key)
redis.call('PEXPIRE', key, 60000)
redis.call('PTTL', key)
announce('{"kind":"health"}')  -- on a cluster, SPUBLISH too: the channel is the key's own name
return 1
