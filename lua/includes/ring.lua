-- ring.lua: the count window (window_calls, config key win_n): the last N outcomes that
-- reached Redis (docs/design.md, "Trip rules"). '<prefix>:{NAME}:ring' (undeclared) holds
-- a byte per outcome: '0' success, '1' failure, '2' slow success, '3' slow failure; a record
-- reads (GETRANGE) and writes (SETRANGE) only its own slots. The window hash holds rn (N),
-- rp (the next slot), rs (the outcomes placed since the ring began: an outcome's ordinal
-- o sits in slot o % N), tc/tf/ts and sat (the claim, as the time window's). The ring
-- fills from slot 0: while tc < rn, rp == tc; once full, rp is the oldest outcome.
-- A time window some caller claims (sat within WINDOW_CLAIM_MS) wins: a caller with
-- window_calls adopts it and never renews its claim, and a time caller restarts the hash.
--
-- Order. A worker sends its successes in a batch up to 50 ms after they ended, so other
-- workers' failures may reach Redis first. The batch carries when each success ended, and
-- the ring places it by that time, before every failure or slow call that arrived after
-- it: the ring holds the outcomes in the order they happened, as if every success had been
-- sent at once (docs/boundary.md, "The count window"). '<prefix>:{NAME}:arrivals'
-- (undeclared; a string, absent unless one arrived lately) keeps when those arrived: an
-- entry of JOURNAL_ENTRY digits each, the arrival (Redis time, us) and the ordinal, oldest
-- first, for JOURNAL_US and at most JOURNAL_MAX.
local RING_MAX = 10000  -- BreakerConfig.window_calls' highest (the live bound clamps to it)
-- A batch reaches Redis within 50 ms; a success older than JOURNAL_US is placed before the
-- failures of the last JOURNAL_US only (before the last JOURNAL_MAX of them).
local JOURNAL_US = 1000000
local JOURNAL_MAX = 512
local JOURNAL_ENTRY = 32  -- 16 digits of arrival, 16 of ordinal
-- A worker's clock that reads more than this behind Redis's, or ahead of it, is not
-- trusted: its successes are placed by their age when the batch was sent instead.
local SKEW_US = 1000000

local function ring_on(c)
  local n = c.win_n
  return n ~= nil and n ~= 0
end

local function ring_key()
  return string.sub(K_STATE, 1, -6) .. 'ring'  -- '<prefix>:{NAME}:state' -> ...:ring
end

local function arrivals_key()
  return string.sub(K_STATE, 1, -6) .. 'arrivals'
end

-- The time window to adopt (a config for window_read; nil when none is claimed), and the
-- ring's bookkeeping (nil: none, or one no worker wrote).
local function ring_find(c)
  local h = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'nb', 'sat', 'rn', 'rp', 'tc', 'tf', 'ts', 'rs')
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
  local rs = tonumber(h[10])
  if not h[10] and p and tc and n then rs = tc == n and p + n or p end  -- a ring written before rs
  if not (n and p and tc and tf and ts and rs and n >= 1 and n <= RING_MAX and n == math.floor(n)
    and p >= 0 and p < n and p == math.floor(p) and tc >= 0 and tc <= n and tc == math.floor(tc)
    and (tc == n or p == tc) and tf >= 0 and tf <= tc and ts >= 0 and ts <= tc
    and rs >= tc and rs == math.floor(rs) and rs % n == p) then
    repaired('window')
    return nil, nil
  end
  return nil, {n = n, p = p, tc = tc, tf = tf, ts = ts, rs = rs, sat = sat}
end

-- The ring applied: the stored one (of another N while that N claims it), or a new one.
local function ring_state(c, r)
  local n = c.win_n
  if r and r.n ~= n and not (r.sat and r.sat > NOW - WINDOW_CLAIM_MS) then r = nil end
  if r == nil then return {n = n, p = 0, tc = 0, tf = 0, ts = 0, rs = 0, reset = true, ring = true} end
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

-- The journal's entries in the window (ordinal at least rs - tc) that arrived within
-- JOURNAL_US: {arrival, ordinal} pairs, oldest first; a journal that does not parse is dropped.
local function journal_load(w)
  local j = redis.call('GET', arrivals_key())
  if not j then return {} end
  if #j % JOURNAL_ENTRY ~= 0 or string.find(j, '%D') then
    repaired('arrivals')
    return {}
  end
  local entries, oldest, first = {}, NOW_US - JOURNAL_US, w.rs - w.tc
  for at = 1, #j, JOURNAL_ENTRY do
    local arrived, ordinal = tonumber(string.sub(j, at, at + 15)), tonumber(string.sub(j, at + 16, at + 31))
    if arrived > oldest and ordinal >= first and ordinal < w.rs then entries[#entries + 1] = {arrived, ordinal} end
  end
  return entries
end

local function journal_save(entries)
  local from, parts = math.max(1, #entries - JOURNAL_MAX + 1), {}
  for i = from, #entries do parts[#parts + 1] = string.format('%016.0f%016.0f', entries[i][1], entries[i][2]) end
  local j = table.concat(parts)
  if j == '' then redis.call('DEL', arrivals_key()) else redis.call('SET', arrivals_key(), j) end
end

-- The batch's end times (ARGV 20 of record.lua: the worker's clock when it sent the batch,
-- the first end time, then each next one as a difference, us), on Redis's clock, oldest
-- first; nil when there are none or not one per success.
local function batch_times(times, calls)
  if times == nil or times == '' then return nil end
  local t, sent, last = {}, nil, 0
  for field in string.gmatch(times, '%d+') do
    local v = tonumber(field)
    if sent == nil then sent = v elseif #t == 0 then last = v; t[1] = v else last = last + v; t[#t + 1] = last end
  end
  if #t ~= calls then return nil end
  local behind = NOW_US - sent  -- the worker's clock behind Redis's, plus the time on the way
  local shift = (behind < 0 or behind > SKEW_US) and behind or 0
  for i = 1, #t do t[i] = math.min(NOW_US, t[i] + shift) end
  return t
end

-- The k successes of a batch in their places: before each journal entry (a failure or a slow
-- call) that arrived after they ended. Returns the first ordinal rewritten and the bytes from
-- it to the newest (the successes among them), or nil when every success comes last; moves
-- the entries it passes.
local function placed(n, w, k, t, entries)
  local e = 1
  while e <= #entries and entries[e][1] <= t[1] do e = e + 1 end
  if e > #entries then return nil end
  local from = entries[e][2]
  local old = ring_get(n, from % n, w.rs - from)
  local parts, done, pos, i = {}, 0, from, 1
  for x = e, #entries do
    local arrived, ordinal = entries[x][1], entries[x][2]
    while i <= k and t[i] < arrived do i = i + 1 end
    parts[#parts + 1] = string.sub(old, pos - from + 1, ordinal - from) .. string.rep('0', i - 1 - done)
    done, pos = i - 1, ordinal
    entries[x][2] = ordinal + done
  end
  parts[#parts + 1] = string.sub(old, pos - from + 1) .. string.rep('0', k - done)
  return from, table.concat(parts)
end

-- Adds one outcome (calls 1) or a batch of successes (calls > 1, or a batch of one with
-- times: record.lua), the batch placed by when its successes ended (times).
local function ring_add(c, r, calls, failures, slows, times)
  local w = ring_state(c, r)
  local n = w.n
  local k = math.min(calls, n)  -- of a batch longer than the ring, only its last n stay
  local t = calls <= n and batch_times(times, calls) or nil
  local journaled = failures + slows > 0
  local entries, from, suffix = {}, nil, nil
  if (t or journaled) and not w.reset then entries = journal_load(w) end
  if t and #entries > 0 then from, suffix = placed(n, w, k, t, entries) end
  local bytes = calls == 1 and string.char(48 + failures + 2 * slows) or string.rep('0', k)
  local gone = ring_get(n, (w.p + (n - w.tc)) % n, k - (n - w.tc))  -- the oldest, overwritten
  if w.reset then  -- written whole: grown by SETRANGE, Redis allocates up to twice over
    redis.call('DEL', K_WINDOW, arrivals_key())
    redis.call('SET', ring_key(), string.rep('0', n))
  end
  if suffix and #suffix > n then  -- the batch pushes out what came before the first it passed
    local kept = string.sub(suffix, #suffix - n + 1)
    ring_set(n, (w.rs + k - n) % n, kept)
    w.tf, w.ts = counted(kept, '[13]'), counted(kept, '[23]')
  else
    ring_set(n, from and from % n or w.p, suffix or bytes)
    w.tf = w.tf + failures - counted(gone, '[13]')
    w.ts = w.ts + slows - counted(gone, '[23]')
  end
  if journaled then entries[#entries + 1] = {NOW_US, w.rs} end
  w.rs, w.p, w.tc = w.rs + k, (w.p + k) % n, math.min(n, w.tc + k)
  local f, m = SCRATCH, 10
  f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10] = 'rp', w.p, 'tc', w.tc, 'tf', w.tf, 'ts', w.ts,
    'rs', w.rs
  if w.reset then f[m + 1], f[m + 2], m = 'rn', n, m + 2 end
  if not w.adopted and (w.reset or not w.sat or NOW - w.sat >= SAT_EVERY_MS or NOW < w.sat) then
    f[m + 1], f[m + 2], m = 'sat', NOW, m + 2  -- this N claimed
  end
  redis.call('HSET', K_WINDOW, unpack(f, 1, m))
  if journaled or from then journal_save(entries) end
  return w
end

-- The window applied, with these outcomes added: the time window, adopted or not, or the ring.
-- times: a batch's end times (ARGV 20 of record.lua), which only a ring reads.
local function window_record(c, calls, failures, slows, times)
  if not ring_on(c) then return window_add(c, calls, failures, slows) end
  local t, r = ring_find(c)
  if t then return window_add(t, calls, failures, slows) end
  return ring_add(c, r, calls, failures, slows, times)
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
