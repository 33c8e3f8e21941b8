-- _lib.lua: the prelude that breaker_redis/scripts.py puts in front of every
-- script, so the state machine's shared steps are written once.
--
-- KEYS (every script, one hash tag {NAME} so one slot):
--   1 state  HASH   state, epoch, open_until, forced, consec, open_ms, ho_ok, seq
--   2 window HASH   head, bms, tc/tf/ts (totals), c<id>/f<id>/s<id> per bucket
--   3 leases ZSET   'p:<epoch>:<seq>' probe leases, 'b:<seq>' bulkhead slots; score = expiry ms
--   4 config HASH   live overrides of BreakerConfig fields (strings)
--   5 stats  HASH   cumulative counters
--   6 events STREAM capped transition history
-- ARGV (every script):
--   1 name  2 pub/sub channel  3 now_ms ('' = Redis TIME; tests only)  4 key TTL ms
-- Scripts that need the config pass its 16 values positionally (CFG_FIELDS
-- order, the same as breaker_redis/config.py LUA_FIELDS) at an index they name.

local K_STATE, K_WINDOW, K_LEASES, K_CONFIG, K_STATS, K_EVENTS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local NAME, CHANNEL, TTL = ARGV[1], ARGV[2], tonumber(ARGV[4])

local NOW
if ARGV[3] ~= '' then
  NOW = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local TOUCHED = {}
local function touch(key) TOUCHED[key] = true end
local function refresh_ttls()
  for key in pairs(TOUCHED) do redis.call('PEXPIRE', key, TTL) end
end

-- Config: the caller's values, then live overrides that parse; a bad
-- override is skipped, never fatal (a corrupted key must not stop a breaker).
local CFG_FIELDS = {'trip', 'failure_threshold', 'failure_rate', 'minimum_calls',
  'slow_call_seconds', 'slow_call_rate', 'window_seconds', 'window_buckets',
  'open_seconds', 'open_backoff', 'max_open_seconds', 'half_open_max_calls',
  'half_open_successes', 'probe_timeout_seconds', 'max_concurrent_calls', 'mode'}
local ENUMS = {trip = {consecutive = true, count = true, rate = true},
  mode = {enforce = true, observe = true}}
local OPTIONAL = {slow_call_seconds = true, max_concurrent_calls = true}

local function load_config(first)
  local raw = {}
  for i, f in ipairs(CFG_FIELDS) do raw[f] = ARGV[first + i - 1] end
  local o = redis.call('HGETALL', K_CONFIG)
  for i = 1, #o, 2 do
    local f, v = o[i], o[i + 1]
    if ENUMS[f] then
      if ENUMS[f][v] then raw[f] = v end
    elseif raw[f] ~= nil then
      if OPTIONAL[f] and (v == '' or v == 'none' or v == 'off') then raw[f] = ''
      elseif tonumber(v) and tonumber(v) > 0 then raw[f] = v end
    end
  end
  local n = function(f) return tonumber(raw[f]) or 0 end
  local c = {trip = raw.trip, mode = raw.mode,
    threshold = n('failure_threshold'), rate = n('failure_rate'),
    min_calls = n('minimum_calls'), slow_ms = math.floor(n('slow_call_seconds') * 1000),
    slow_rate = n('slow_call_rate'), buckets = math.max(1, math.floor(n('window_buckets'))),
    open_ms = math.floor(n('open_seconds') * 1000), backoff = math.max(1, n('open_backoff')),
    max_open_ms = math.floor(n('max_open_seconds') * 1000),
    ho_max = math.max(1, n('half_open_max_calls')), ho_successes = math.max(1, n('half_open_successes')),
    probe_ms = math.max(1, math.floor(n('probe_timeout_seconds') * 1000)),
    max_conc = math.floor(n('max_concurrent_calls'))}
  c.bucket_ms = math.max(1, math.floor(n('window_seconds') * 1000 / c.buckets))
  if c.max_open_ms < c.open_ms then c.max_open_ms = c.open_ms end
  return c
end

-- State: a missing or corrupted hash reads as a fresh closed breaker.
local function load_state()
  local v = redis.call('HMGET', K_STATE, 'state', 'epoch', 'open_until', 'forced',
    'consec', 'open_ms', 'ho_ok', 'seq')
  local s = {state = v[1], epoch = tonumber(v[2]) or 0, open_until = tonumber(v[3]) or 0,
    forced = v[4] or '', consec = tonumber(v[5]) or 0, open_ms = tonumber(v[6]) or 0,
    ho_ok = tonumber(v[7]) or 0, seq = tonumber(v[8]) or 0, dirty = false}
  if s.state ~= 'closed' and s.state ~= 'open' and s.state ~= 'half_open' then
    s.state, s.epoch, s.dirty = 'closed', s.epoch + 1, true
  end
  if s.forced ~= 'open' and s.forced ~= 'closed' then s.forced = '' end
  return s
end

local function save_state(s)
  if not s.dirty then return end
  redis.call('HSET', K_STATE, 'state', s.state, 'epoch', s.epoch, 'open_until', s.open_until,
    'forced', s.forced, 'consec', s.consec, 'open_ms', s.open_ms, 'ho_ok', s.ho_ok, 'seq', s.seq)
  touch(K_STATE)
end

local function stat(field, by)
  if by ~= 0 then
    redis.call('HINCRBY', K_STATS, field, by)
    touch(K_STATS)
  end
end

-- Rejections decided in a worker's memory arrive here in batches.
local function flush_pending(rejected, would_reject)
  stat('rejected', tonumber(rejected) or 0)
  stat('would_reject', tonumber(would_reject) or 0)
end

-- Every transition: epoch+1, one stream entry, one pub/sub message.
local EVENTS = {}
local function transition(s, to, cause)
  local from = s.state
  s.state, s.epoch, s.dirty = to, s.epoch + 1, true
  redis.call('XADD', K_EVENTS, 'MAXLEN', '~', 1000, '*', 'from', from, 'to', to,
    'epoch', s.epoch, 'cause', cause, 'forced', s.forced, 'open_until', s.open_until, 'at', NOW)
  touch(K_EVENTS)
  redis.call('PUBLISH', CHANNEL, string.format(
    '{"name":"%s","kind":"transition","from":"%s","to":"%s","epoch":%d,"open_until":%d,"forced":"%s","cause":"%s","at":%d}',
    NAME, from, to, s.epoch, s.open_until, s.forced, cause, NOW))
  EVENTS[#EVENTS + 1] = from .. '>' .. to .. ':' .. cause
end

-- Leases. Probe leases exist only in half_open; leaving it drops them.
local function drop_probes()
  local all = redis.call('ZRANGE', K_LEASES, 0, -1)
  for _, m in ipairs(all) do
    if string.sub(m, 1, 2) == 'p:' then redis.call('ZREM', K_LEASES, m) end
  end
end

local function count_probes()
  local n = 0
  for _, m in ipairs(redis.call('ZRANGE', K_LEASES, 0, -1)) do
    if string.sub(m, 1, 2) == 'p:' then n = n + 1 end
  end
  return n
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
  touch(K_LEASES)
  return id
end

-- Window: buckets of cfg.bucket_ms; bucket ids in (head - buckets, head] are live.
-- Returns the totals as of NOW and the ids that slid out (for the writer to drop).
local function window_read(cfg)
  local cur = math.floor(NOW / cfg.bucket_ms)
  local w = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'tc', 'tf', 'ts')
  local head, tc, tf, ts = tonumber(w[1]), tonumber(w[3]) or 0, tonumber(w[4]) or 0, tonumber(w[5]) or 0
  if head == nil or tonumber(w[2]) ~= cfg.bucket_ms or tc < 0 or tf < 0 or ts < 0 then
    return {cur = cur, tc = 0, tf = 0, ts = 0, reset = true, gone = {}}
  end
  if cur < head then cur = head end -- a clock step backwards counts into the newest bucket
  if cur - cfg.buckets >= head then
    return {cur = cur, tc = 0, tf = 0, ts = 0, reset = true, gone = {}}
  end
  local gone = {}
  for id = head - cfg.buckets + 1, cur - cfg.buckets do
    local b = redis.call('HMGET', K_WINDOW, 'c' .. id, 'f' .. id, 's' .. id)
    tc, tf, ts = tc - (tonumber(b[1]) or 0), tf - (tonumber(b[2]) or 0), ts - (tonumber(b[3]) or 0)
    gone[#gone + 1] = id
  end
  return {cur = cur, tc = math.max(tc, 0), tf = math.max(tf, 0), ts = math.max(ts, 0), reset = false, gone = gone}
end

local function window_add(cfg, failed, slow)
  local w = window_read(cfg)
  if w.reset then redis.call('DEL', K_WINDOW) end
  for _, id in ipairs(w.gone) do redis.call('HDEL', K_WINDOW, 'c' .. id, 'f' .. id, 's' .. id) end
  local f, s = failed and 1 or 0, slow and 1 or 0
  local id = w.cur
  local b = redis.call('HMGET', K_WINDOW, 'c' .. id, 'f' .. id, 's' .. id)
  w.tc, w.tf, w.ts = w.tc + 1, w.tf + f, w.ts + s
  redis.call('HSET', K_WINDOW, 'head', id, 'bms', cfg.bucket_ms, 'tc', w.tc, 'tf', w.tf, 'ts', w.ts,
    'c' .. id, (tonumber(b[1]) or 0) + 1, 'f' .. id, (tonumber(b[2]) or 0) + f, 's' .. id, (tonumber(b[3]) or 0) + s)
  touch(K_WINDOW)
  return w
end

-- Which trip rule holds for these window totals and consecutive count (nil: none).
local function trip_cause(cfg, w, consec)
  if cfg.trip == 'consecutive' and consec >= cfg.threshold then return 'consecutive' end
  if cfg.trip == 'count' and w.tf >= cfg.threshold then return 'count' end
  if cfg.trip == 'rate' and w.tc >= cfg.min_calls and w.tf / w.tc >= cfg.rate then return 'rate' end
  if cfg.slow_ms > 0 and w.tc >= cfg.min_calls and w.ts / w.tc >= cfg.slow_rate then return 'slow' end
  return nil
end

-- Open: the first trip for exactly open_seconds; a trip after a failed
-- half-open multiplies the last period by the backoff (capped) and adds up
-- to 10% jitter derived from the time and epoch, so breakers spread out.
local function trip_open(s, cfg, cause, after_half_open)
  local base, dur = cfg.open_ms, cfg.open_ms
  if after_half_open then
    base = math.min(math.floor(math.max(s.open_ms, cfg.open_ms) * cfg.backoff), cfg.max_open_ms)
    dur = base + math.floor(base * (((NOW % 997) * 31 + s.epoch * 17) % 100) / 1000)
    drop_probes()
  end
  s.open_ms, s.open_until, s.consec, s.ho_ok = base, NOW + dur, 0, 0
  transition(s, 'open', cause)
  stat('trips', 1)
end

local function close(s, cause)
  s.consec, s.open_ms, s.ho_ok, s.open_until = 0, 0, 0, 0
  redis.call('DEL', K_WINDOW)
  drop_probes()
  transition(s, 'closed', cause)
end

-- The reply every state-changing script gives, so a worker refreshes what it knows:
-- {allowed, reason, state, epoch, open_until, forced, lease, now, mode, max_conc, events}
local function reply(s, allowed, reason, lease, cfg)
  save_state(s)
  refresh_ttls()
  return {allowed, reason, s.state, s.epoch, s.open_until, s.forced, lease, NOW,
    cfg and cfg.mode or '', cfg and cfg.max_conc or 0, table.concat(EVENTS, ',')}
end
