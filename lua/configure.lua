-- configure.lua: write live overrides of BreakerConfig fields; every worker
-- applies them at its next script call (the scripts merge this hash over the
-- worker's own config) and drops what it knew on the pub/sub message.
--
-- KEYS  : state, window, leases, config, stats, events (see _lib.lua)
-- ARGV  : 1-4 common; 5.. field, value pairs ('' value removes the override).
--         The caller validated them (breaker_redis.config.parse_overrides).
-- Reads : config.  Writes: config; publishes {"kind":"config"}.
-- Returns the overrides now in force as a flat field, value list.
for i = 5, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', K_CONFIG, ARGV[i])
  else
    redis.call('HSET', K_CONFIG, ARGV[i], ARGV[i + 1])
  end
end
touch(K_CONFIG)
refresh_ttls()
redis.call('PUBLISH', CHANNEL, string.format('{"name":"%s","kind":"config","at":%d}', NAME, NOW))
return redis.call('HGETALL', K_CONFIG)
