-- stats.lua: the cumulative counters (the stats hash): stat, and flush_pending for
-- what a worker counted in memory.
--
-- A counter that does not parse (the hash was edited) starts again from `by`.
local function stat(field, by)
  if by == 0 then return end
  local n = redis.pcall('HINCRBY', K_STATS, field, by == 1 and '1' or by)  -- a number costs Redis a %.17g
  if type(n) == 'table' and n.err then
    local message = tostring(n.err)  -- (a string on Redis; the embedded store may give another type)
    if not string.find(message, 'not an integer', 1, true) and not string.find(message, 'overflow', 1, true) then
      error(n)  -- not a corrupted counter (a permission, the wrong type): as redis.call would
    end
    repaired('stats')
    redis.call('HSET', K_STATS, field, by)
  end
end

-- What a worker counted in memory arrives here in batches, in its arguments
-- (a: a script's own arguments, a.rejected .. a.slow, named as the counters): rejections and would_reject decided from memory, then the outcomes of
-- calls it admitted in observe mode while the breaker was open (they decide
-- nothing: only an acquire-script probe decides half_open).
local PENDING = {'rejected', 'would_reject', 'successes', 'failures', 'ignored', 'slow'}
local function flush_pending(a)
  for i = 1, 6 do
    local raw = a[PENDING[i]]
    if raw ~= '0' and raw ~= '' then  -- usually: nothing counted (a string compare, no parse)
      local n = tonumber(raw)
      if n and n ~= 0 then stat(PENDING[i], n) end
    end
  end
end
