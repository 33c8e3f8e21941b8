-- ring.lua: the count window (window_calls, config key win_n): the last N outcomes that
-- reached Redis (docs/design.md, "Trip rules"). '<prefix>:{NAME}:ring' (undeclared) holds
-- a byte per outcome: '0' success, '1' failure, '2' slow success, '3' slow failure; a record
-- reads (GETRANGE) and writes (SETRANGE) only its own slots. The window hash holds rn (N),
-- rp (the next slot), tc/tf/ts and sat (the claim, as the time window's). The ring fills
-- from slot 0: while tc < rn, rp == tc; once full, rp is the oldest outcome.
-- A time window some caller claims (sat within WINDOW_CLAIM_MS) wins: a caller with
-- window_calls adopts it and never renews its claim, and a time caller restarts the hash.
local RING_MAX = 10000  -- BreakerConfig.window_calls' highest (the live bound clamps to it)

local function ring_on(c)
  local n = c.win_n
  return n ~= nil and n ~= 0
end

local function ring_key()
  return string.sub(K_STATE, 1, -6) .. 'ring'  -- '<prefix>:{NAME}:state' -> ...:ring
end

-- The time window to adopt (a config for window_read; nil when none is claimed), and the
-- ring's bookkeeping (nil: none, or one no worker wrote).
local function ring_find(c)
  local h = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'nb', 'sat', 'rn', 'rp', 'tc', 'tf', 'ts')
  local head, bms, nb, sat = tonumber(h[1]), tonumber(h[2]), tonumber(h[3]) or 10, tonumber(h[4])
  if h[1] then
    local live = head and bms and bms >= 1 and bms == math.floor(bms) and nb >= 1 and nb <= 100
      and nb == math.floor(nb) and math.floor(NOW / bms) - nb < head
    if live and sat and sat > NOW - WINDOW_CLAIM_MS then
      return {bucket_ms = bms, buckets = nb, trip = c.trip, slow_ms = c.slow_ms, no_claim = true}, nil
    end
    return nil, nil  -- a time window no one claims: the ring starts afresh
  end
  local n, p, tc, tf, ts = tonumber(h[5]), tonumber(h[6]), tonumber(h[7]), tonumber(h[8]), tonumber(h[9])
  if not h[5] then return nil, nil end
  if not (n and p and tc and tf and ts and n >= 1 and n <= RING_MAX and n == math.floor(n)
    and p >= 0 and p < n and p == math.floor(p) and tc >= 0 and tc <= n and tc == math.floor(tc)
    and (tc == n or p == tc) and tf >= 0 and tf <= tc and ts >= 0 and ts <= tc) then
    repaired('window')
    return nil, nil
  end
  return nil, {n = n, p = p, tc = tc, tf = tf, ts = ts, sat = sat}
end

-- The ring applied: the stored one (of another N while that N claims it), or a new one.
local function ring_state(c, r)
  local n = c.win_n
  if r and r.n ~= n and not (r.sat and r.sat > NOW - WINDOW_CLAIM_MS) then r = nil end
  if r == nil then return {n = n, p = 0, tc = 0, tf = 0, ts = 0, reset = true, ring = true} end
  r.adopted, r.reset, r.ring = r.n ~= n, false, true
  return r
end

-- The bytes of slots [from, from + count) of a ring of n, wrapping.
local function ring_get(n, from, count)
  if count <= 0 then return '' end
  local key, first = ring_key(), math.min(count, n - from)
  local got = redis.call('GETRANGE', key, from, from + first - 1)
  if first < count then got = got .. redis.call('GETRANGE', key, 0, count - first - 1) end
  return got
end

local function ring_set(n, from, bytes)
  local key, first = ring_key(), math.min(#bytes, n - from)
  redis.call('SETRANGE', key, from, first == #bytes and bytes or string.sub(bytes, 1, first))
  if first < #bytes then redis.call('SETRANGE', key, 0, string.sub(bytes, first + 1)) end
end

local function counted(bytes, pattern)
  if bytes == '' or not string.find(bytes, '[123]') then return 0 end  -- all successes: one scan
  local _, found = string.gsub(bytes, pattern, '')
  return found
end

-- Adds one outcome (calls 1) or a batch of successes (calls > 1: record.lua).
local function ring_add(c, r, calls, failures, slows)
  local w = ring_state(c, r)
  local n = w.n
  local k = math.min(calls, n)  -- of a batch longer than the ring, only its last n stay
  local bytes = calls == 1 and string.char(48 + failures + 2 * slows) or string.rep('0', k)
  local gone = ring_get(n, (w.p + (n - w.tc)) % n, k - (n - w.tc))  -- the oldest, overwritten
  if w.reset then  -- written whole: grown by SETRANGE, Redis allocates up to twice over
    redis.call('DEL', K_WINDOW)
    redis.call('SET', ring_key(), string.rep('0', n))
  end
  ring_set(n, w.p, bytes)
  w.p, w.tc = (w.p + k) % n, math.min(n, w.tc + k)
  w.tf = w.tf + failures - counted(gone, '[13]')
  w.ts = w.ts + slows - counted(gone, '[23]')
  local f, m = SCRATCH, 8
  f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8] = 'rp', w.p, 'tc', w.tc, 'tf', w.tf, 'ts', w.ts
  if w.reset then f[m + 1], f[m + 2], m = 'rn', n, m + 2 end
  if not w.adopted and (w.reset or not w.sat or NOW - w.sat >= SAT_EVERY_MS or NOW < w.sat) then
    f[m + 1], f[m + 2], m = 'sat', NOW, m + 2  -- this N claimed
  end
  redis.call('HSET', K_WINDOW, unpack(f, 1, m))
  return w
end

-- The window applied, with these outcomes added: the time window, adopted or not, or the ring.
local function window_record(c, calls, failures, slows)
  if not ring_on(c) then return window_add(c, calls, failures, slows) end
  local t, r = ring_find(c)
  if t then return window_add(t, calls, failures, slows) end
  return ring_add(c, r, calls, failures, slows)
end

-- The window as of now, for a reader (snapshot.lua, read.lua): writes nothing.
local function window_now(c)
  if not ring_on(c) then return window_read(c) end
  local t, r = ring_find(c)
  if t then return window_read(t) end
  return ring_state(c, r)
end

-- minimum_calls, at most N with a ring (as Resilience4j's count window).
local function least_calls(c, w)
  if w.ring and w.n < c.min_calls then return w.n end
  return c.min_calls
end
