-- ring.lua: the count window (window_calls, config key win_n): the last N outcomes that
-- reached Redis, all workers together, in place of the time window (docs/design.md,
-- "Trip rules"; docs/boundary.md, "The count window").
--
-- The outcomes: '<prefix>:{NAME}:ring', a string of N bytes, one per outcome: '0' a
-- success, '1' a failure, '2' a slow success, '3' a slow failure (written with
-- SETRANGE, read with GETRANGE: a record costs O(its outcomes), never O(N)). Undeclared
-- (breaker_redis/storage/keys.py UNDECLARED_SUFFIXES): only a breaker with window_calls
-- touches it. Its bookkeeping is in the window hash, in place of the time window's:
--   rn (N), rp (the slot the next outcome goes to), tc/tf/ts (outcomes, failures, slow in
--   the ring), sat (when a caller of this N last claimed it, as the time window's)
-- The ring fills from slot 0; while tc < rn, rp == tc and the slots from rp on hold
-- nothing; once full, rp is also the oldest outcome, the next to slide out.
--
-- Rolling deploys: the time window wins. While a caller judging by time (an older
-- version, or a config without window_calls) claims the window hash (its sat within
-- WINDOW_CLAIM_MS), a caller with window_calls adopts that time window, shape and all,
-- and never renews its claim; such a caller finds a ring's hash (no head) and starts its
-- time window, so every worker judges one window. Once no one has claimed the time
-- window for WINDOW_CLAIM_MS, the next caller with window_calls starts the ring.
-- Two values of window_calls adopt each other's ring as two time shapes do.
local RING_MAX = 10000  -- BreakerConfig.window_calls' highest (the live bound clamps to it)

local function ring_on(c)
  local n = c.win_n
  return n ~= nil and n ~= 0
end

local function ring_key()
  return string.sub(K_STATE, 1, -6) .. 'ring'  -- '<prefix>:{NAME}:state' -> ...:ring
end

-- The window hash as a caller with window_calls finds it: the time window to adopt
-- ({bucket_ms, buckets, no_claim} for window_read; nil when none is claimed), and the
-- ring's bookkeeping (nil when there is none, or not one a worker wrote).
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

-- The ring a caller applies: the stored one, or while another N claims it, that N.
-- Returns the window as window_read does (tc, tf, ts, reset) plus n, p and sat.
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

-- Adds outcomes to the ring: one (calls 1: failed and slow as given) or a batch of
-- successes (calls > 1, never failed nor slow: record.lua). Only the slots written are
-- read (what slides out) and written.
local function ring_add(c, r, calls, failures, slows)
  local w = ring_state(c, r)
  local n = w.n
  local k = math.min(calls, n)  -- of a batch longer than the ring, only its last n stay
  local bytes = calls == 1 and string.char(48 + failures + 2 * slows) or string.rep('0', k)
  local gone = ring_get(n, (w.p + (n - w.tc)) % n, k - (n - w.tc))  -- the oldest, overwritten
  if w.reset then  -- a time window no one claims, a ring of another N, or edited: a ring
    -- written whole, n bytes at once (grown by SETRANGE, Redis would allocate it up to twice over)
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

-- The window a caller applies, with these outcomes added: the time window, the ring,
-- or (window_calls set while a time window is claimed) the time window adopted.
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

-- The fewest calls a window rule needs: minimum_calls, and with window_calls at most the
-- ring's size (as Resilience4j's count window: a ring of 10 with minimum_calls 20 trips).
local function least_calls(c, w)
  if w.ring and w.n < c.min_calls then return w.n end
  return c.min_calls
end
