-- leases.lua: the leases set: probe leases (half_open) and bulkhead slots.
--
-- Leases. Probe leases exist only in half_open; leaving it drops them.
local function probe_ids()
  local ids = {}
  for _, m in ipairs(redis.call('ZRANGE', K_LEASES, 0, -1)) do
    if string.sub(m, 1, 2) == 'p:' then ids[#ids + 1] = m end
  end
  return ids
end

local function drop_probes()
  local ids = probe_ids()
  if #ids > 0 then redis.call('ZREM', K_LEASES, unpack(ids)) end
end

-- Removes expired leases; returns how many of them were probes.
local function reap_leases()
  local expired = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', NOW)
  if #expired == 0 then return 0 end
  redis.call('ZREMRANGEBYSCORE', K_LEASES, '-inf', NOW)
  local probes = 0
  for _, m in ipairs(expired) do
    if string.sub(m, 1, 2) == 'p:' then probes = probes + 1 end
  end
  return probes
end

local function take_lease(s, kind, ttl_ms)
  s.seq, s.dirty = s.seq + 1, true
  local id = kind == 'p' and ('p:' .. s.epoch .. ':' .. s.seq) or ('b:' .. s.seq)
  redis.call('ZADD', K_LEASES, NOW + ttl_ms, id)
  return id
end
