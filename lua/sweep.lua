-- sweep.lua: remove one breaker if nobody has used it for the key TTL. The
-- keys carry no TTL of their own (an evicting Redis would take a key with a
-- TTL first: see _lib.lua), so idle breakers are removed here instead: each
-- worker sweeps a few names picked at random from the names set, rarely
-- (breaker_redis/storage/scripts.py, register_name).
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-4 common (4: the key TTL, the idle time after which it goes)
-- Reads : state (ttl_at: stamped at most once a minute while in use; ttl: the
--         writer's key TTL), and whether any key exists.
-- Writes: deletes every key of an idle breaker (its ring and arrivals too: includes/ring.lua).
-- Returns 1 when the breaker is gone (removed now, or no key of it left:
--         the caller drops the name from the names set), else 0. A breaker
--         with live overrides and no state yet (configured before first use)
--         stays.
local used = redis.call('HMGET', K_STATE, 'ttl_at', 'state', 'ttl')
if used[2] then
  -- idle for the longer of this caller's TTL and the writer's: a process with a short one
  -- must not sweep a breaker that processes with a long one use (they stamp it more rarely)
  local at, ttl = tonumber(used[1]), math.max(TTL, tonumber(used[3]) or 0)
  if not at or (NOW - at < ttl and at <= NOW + ttl) then return 0 end  -- in use (or unknown: kept)
  redis.call('DEL', ring_key(), arrivals_key(), unpack(KEY_LIST))  -- and the count window's (ring.lua)
  return 1
end
for i = 2, #KEY_LIST do
  if redis.call('EXISTS', KEY_LIST[i]) == 1 then return 0 end
end
redis.call('DEL', ring_key(), arrivals_key())  -- a ring outlives its window hash (a close drops only that)
return 1
