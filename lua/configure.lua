-- configure.lua: write live overrides of BreakerConfig fields; every worker
-- applies them at its next script call (the scripts merge this hash over the
-- worker's own config) and drops what it knew on the pub/sub message.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common (5 unused: ''); 7.. field, value pairs ('' value removes the override):
--         `a.changes` below.
--         The caller validated them (breaker_redis/base/config.py, checked_changes).
-- Reads : config.  Writes: config, and drops the window when its shape is set; publishes {"kind":"config"}. A value written with
--         redis-cli instead holds as well, from the next script (unannounced).
-- Returns the overrides now in force as a flat field, value list.
-- This script's own arguments, named once (breaker_redis/storage/args.py ConfigureArgs; docs/wire.md):
local a = {changes = {unpack(ARGV, 7)}}
local changes = a.changes
for i = 1, #changes, 2 do
  local field, value = changes[i], changes[i + 1]
  -- a new window shape holds at once: the old window is not kept for it (see window_read)
  if field == 'window_seconds' or field == 'window_buckets' or field == 'window_calls' then
    redis.call('DEL', K_WINDOW)  -- (a ring's bytes are rewritten from its first slot: ring.lua)
  end
  if value == '' then
    redis.call('HDEL', K_CONFIG, field)
  else
    redis.call('HSET', K_CONFIG, field, value)
  end
end
local overrides = redis.call('HGETALL', K_CONFIG)
if #overrides > 0 then redis.call('PERSIST', K_CONFIG) end  -- a TTL an older version gave it
notify({name = NAME, kind = 'config', db = DB, at = NOW})
overrides[#overrides + 1], overrides[#overrides + 2] = ' ack', ack_field()  -- not a field name
return overrides
