-- config.lua: the config a call applies: the caller's JSON (ARGV 5) with the live
-- overrides of the config hash held to BreakerConfig's rules (load_config).
--
-- Live overrides: the config hash, in BreakerConfig names and units, written
-- by configure.lua or by hand (redis-cli HSET). Each value is held to
-- BreakerConfig's own rules: one that does not parse, is not an integer where
-- one is due, or is below the lowest allowed is skipped (the caller's value
-- stays); one above the highest allowed is clamped to it. Never fatal, never
-- unbounded. The rules are written once, where BreakerConfig declares its
-- fields (breaker_redis/base/config.py LIVE_FIELDS); breaker_redis/storage/lua_rules.py writes
-- them into rules() below, in place of its LIVE_RULES line, when it builds
-- the scripts' text, so the two cannot differ:
--   BOUNDS[field] = {config key, unit (1000: seconds, the config's ms), lowest,
--                    lowest excluded, highest, integer, can be off (0)}
--   WORDS[field]  = {word = true, ...}: the words a field of words takes
--   OFF           = {value = true, ...}: the values that turn a field off
--   OPEN_MS, CAP_FLOOR_MS: the open period and the cap's floor when unset (apply_overrides)
local BOUNDS, WORDS, OFF, OPEN_MS, CAP_FLOOR_MS
local function rules()  -- when first needed: under EVAL this prelude runs every call
  if BOUNDS then return end
  --@LIVE_RULES@ (BreakerConfig's fields, written here by breaker_redis/storage/lua_rules.py)
end

-- A live value within bounds (in the field's own unit), or nil to skip it.
local function bounded(b, v)
  if string.find(v, '[^%d%.eE+-]') then return nil end  -- decimal only: no hex, inf, nan, spaces
  local n = tonumber(v)
  if n == nil then return nil end
  if b[6] and n > -math.huge and n < math.huge and n ~= math.floor(n) then return nil end
  if n < b[3] or (b[4] and n == b[3]) then return nil end
  if n > b[5] then return b[5] end
  return n
end

local function apply_overrides(c, o)
  rules()
  local window_ms = c.bucket_ms * c.buckets
  local open_set, cap_set = c.open_set == 1, c.cap_set == 1
  for i = 1, #o, 2 do
    local f, v = o[i], o[i + 1]
    local b = BOUNDS[f]
    if WORDS[f] then
      if WORDS[f][v] then c[f] = v end
    elseif b and b[7] and OFF[v] then
      c[b[1]] = 0
    elseif b then
      local n = bounded(b, v)
      if n then
        n = n * b[2]
        if f == 'window_seconds' then window_ms = n else c[b[1]] = n end
        if f == 'open_seconds' then open_set = true elseif f == 'max_open_seconds' then cap_set = true end
      end
    end
  end
  -- the one of open_seconds / max_open_seconds left unset follows the other
  -- (breaker_redis/base/config.py): cap = max(300 s, open), open = min(30 s, cap)
  if open_set and not cap_set then c.max_open_ms = math.max(CAP_FLOOR_MS, c.open_ms) end
  if cap_set and not open_set then c.open_ms = math.min(OPEN_MS, c.max_open_ms) end
  c.bucket_ms = math.max(1, math.floor(window_ms / c.buckets))
  c.max_open_ms = math.max(c.max_open_ms, c.open_ms)
  if c.min_rep == 1 then c.min_rep = nil end  -- absent unless above 1 (see "One sick host")
  return c
end

-- The config's keys. A config table (c, cfg) keeps the short keys of the JSON a worker
-- sends (ARGV 5, BreakerConfig.to_lua in breaker_redis/base/config.py): renamed,
-- every call under EVAL would pay for it, and snapshot.lua and read.lua reply the table
-- as JSON the readers parse. This is the one place that says what each key is (docs/wire.md
-- points here; tests/storage/test_args.py checks it against to_lua), times in ms:
--   @config trip          trip: consecutive | count | rate
--   @config mode          mode: enforce | observe
--   @config threshold     failure_threshold
--   @config rate          failure_rate
--   @config min_calls     minimum_calls
--   @config slow_ms       slow_call_seconds (0: no slow-call rule)
--   @config slow_rate     slow_call_rate
--   @config bucket_ms     window_seconds / window_buckets (a live override: window_ms)
--   @config buckets       window_buckets
--   @config win_n         window_calls (absent or 0: the time window; includes/ring.lua)
--   @config open_ms       open_seconds
--   @config backoff       open_backoff
--   @config max_open_ms   max_open_seconds
--   @config open_set      open_seconds set by the user (1) or derived (0)
--   @config cap_set       max_open_seconds set by the user (1) or derived (0)
--   @config ho_max        half_open_max_calls
--   @config ho_successes  half_open_successes
--   @config probe_ms      probe_timeout_seconds
--   @config max_conc      max_concurrent_calls (0: no bulkhead)
--   @config min_rep       min_reporters (absent when 1: "One sick host", reporters.lua)
--   @config group         the breaker group it is a member of (absent: none; breaker_redis/groups.py)
--   @config ramp_ms       ramp_seconds (absent: 0, no ramp; includes/ramp.lua)
--   @config ramp_from     ramp_from (absent: 0.1)

-- The caller's config (ARGV 5) with the live overrides applied. The config
-- hash is read on every call, so a value written with redis-cli holds from
-- the next script any worker runs (an empty hash costs one short command).
--
-- As a Function library (breaker_redis/storage/lua_source.py library) this prelude's
-- upvalues outlive a call, so each distinct config text, with the overrides
-- in force, is decoded and merged once and kept (at most CONFIGS_KEPT; a pure
-- function of the two, nothing else is kept). A kept table is never changed.
-- Under EVAL the cache is new on every call.
local CONFIGS, CONFIGS_N, CONFIGS_KEPT = {}, 0, 64
local function load_config()
  local raw = ARGS[5]
  local o = redis.call('HGETALL', K_CONFIG)
  local key = raw
  if #o > 0 then  -- the merged config is kept too, under the config text and the overrides
    local parts = {raw}
    for i = 1, #o do parts[i + 1] = #o[i] .. ':' .. o[i] end  -- length-prefixed: unambiguous
    key = table.concat(parts, ',')
  end
  local c = CONFIGS[key]
  if c == nil then
    c = cjson.decode(raw)
    if #o > 0 then c = apply_overrides(c, o) end
    if CONFIGS_N >= CONFIGS_KEPT then CONFIGS, CONFIGS_N = {}, 0 end
    CONFIGS[key], CONFIGS_N = c, CONFIGS_N + 1
  end
  return c
end
