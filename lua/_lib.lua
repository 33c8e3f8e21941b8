-- _lib.lua: the prelude that breaker_redis/scripts.py puts in front of every
-- script, so the state machine's shared steps are written once. Loaded once
-- as the top of a Redis Functions library, or run on every call in front of
-- an EVAL script, so it only defines (a library's top level may not even read
-- the standard globals); each script starts with begin(KEYS, ARGV). The
-- record script's common path (closed, no override) costs six commands: TIME,
-- HMGET state, HGETALL config, HMGET window, HSET window, HINCRBY stats.
--
-- KEYS (every script, one hash tag {NAME} so one slot):
--   1 state  HASH   state, epoch, open_until, forced, consec, open_ms, ho_ok, seq,
--                   ttl_at (when a worker last used the keys, renewed at most once a
--                   minute: an idle breaker is removed by sweep.lua after the key TTL),
--                   ttl (the key TTL of the worker that wrote it, for sweep.lua),
--                   born (the epoch this hash was created with), armed ('1' while a
--                   late success could change a decision), arms (how often it armed),
--                   lost (the born of the last incarnation whose loss was counted),
--                   held (the born of the last incarnation an operator acted on: admin.lua);
--                   a breaker group member's also grant (the group's token it holds while it
--                   may be open) and revoked (the highest token taken back): see give_back_grant
--   2 window HASH   head, bms (bucket ms), nb (buckets), sat (when a caller of this shape last
--                   wrote it), tc/tf/ts (totals), c<id>/f<id>/s<id> per bucket; bms and nb let a
--                   reader without the config (the CLI) read the window
--   3 leases ZSET   'p:<epoch>:<seq>' probe leases, 'b:<seq>' bulkhead slots; score = expiry ms
--   4 config HASH   live overrides of BreakerConfig fields (strings, seconds)
--   5 stats  HASH   cumulative counters (calls is derived: successes + failures + ignored)
--   6 events LIST   the last EVENTS_KEPT transitions, newest first, one line each:
--                   '<at ms> <from> <to> <cause> <epoch> <open_until ms> <forced or ->'
--                   (a list, not a stream: Redis 7 gives a stream's first entry a 4 KB node)
--   7 cfg    STRING the config JSON (ARGV 5) of the last acquire/record that wrote the state,
--                   for readers without the apps' configs (the CLI's `show`)
-- No key carries a TTL: under a volatile-* maxmemory-policy Redis then never
-- evicts them (under allkeys-* it may: see load_state for what a worker does
-- about it); breakers idle longer than the key TTL are removed by sweep.lua.
-- ARGV (every script):
--   1 name  2 pub/sub channel and database: '<prefix>:events <db>', db the number of the
--     database the caller SELECTs (0 on a cluster), which every message carries (publish,
--     configure.lua): pub/sub ignores the database, so a worker hears the breakers of the
--     same name on every database of the server and drops those of another
--     (Breakers._on_event); on Redis Cluster followed, after a space, by the breaker's sharded channel
--     <prefix>:{NAME}:notices (in the breaker's slot), which the scripts SPUBLISH to as
--     well (notify)  3 now_ms ('' = Redis TIME; tests only)
--   4 key TTL ms: a breaker unused this long is idle (sweep.lua)
--   5 config: JSON from breaker_redis/config.py (to_lua_json), times in ms:
--     trip, mode, threshold, rate, min_calls, slow_ms, slow_rate, bucket_ms, buckets,
--     open_ms, backoff, max_open_ms, ho_max, ho_successes, probe_ms, max_conc
--   6 the highest epoch the caller knows ('' or 0 if none): a state hash created
--     anew (keys evicted, flushed, expired or repaired) starts above it and above
--     the Redis time in ms, so epochs never go backwards; followed, when the caller
--     knows the breaker's state now, by that state: 'floor state epoch born
--     open_until forced' (forced '-' for none), which acquire and record restore
--     when they find it lost (load_state), and ' heard' when the caller only heard
--     of it, in a message about a later incarnation of the keys than any Redis
--     replied to it about (restore_lost)

-- This call's keys and arguments and what is derived from them: set by begin(),
-- which every script calls first. Upvalues rather than the KEYS and ARGV
-- globals, so the same text runs as an EVAL script (where this prelude runs on
-- every call) and as a library of Redis Functions (loaded once; each function
-- gets its keys and arguments as parameters).
local KEY_LIST, ARGS
local K_STATE, K_WINDOW, K_LEASES, K_CONFIG, K_STATS, K_EVENTS, K_CFG
local NAME, CHANNEL, DB, SHARD, WORKERS, TTL, FLOOR, KNOWN, TTL_REFRESH_MS, NOW
-- Keys found corrupted (a field that does not parse) and repaired by this call,
-- for the reply: the worker logs them, once each. EVENTS: the transitions of this call.
-- LOST: '' or what this call found of a state the caller knew and Redis had lost
-- ('restored' from the caller's knowledge, or 'lost': it knew it closed).
local REPAIRED, EVENTS, LOST
-- ACK: this call's acknowledged notices, {token, workers that heard them} (notify), or nil
local ACK
-- ISO: the calling reporter's isolation (until, ms) for the reply; nil, and nothing in the
-- reply, unless min_reporters > 1 and that reporter is isolated (see "One sick host" below)
local ISO

-- tonumber for the values a script reads again and again (epochs, times, the
-- state's fields, ARGV): Lua's tonumber costs two strtod calls, a lookup here a
-- fraction of one. A value Redis or a caller gives as the same text is one
-- interned Lua string, so the memo is keyed by it. Strings only (a hash field,
-- an argument); at most NUMS_KEPT kept, then it starts afresh.
local NUMS, NUMS_N, NUMS_KEPT = {}, 0, 256
local function num(x)
  if not x then return nil end  -- false: a field missing from the hash
  local n = NUMS[x]
  if n == nil then
    n = tonumber(x)
    if n == nil then return nil end
    if NUMS_N >= NUMS_KEPT then NUMS, NUMS_N = {}, 0 end
    NUMS[x], NUMS_N = n, NUMS_N + 1
  end
  return n
end

-- What a script derives from an argument's text (its channels, the key TTL's
-- refresh period, ARGV 6), kept per text in MEMO[kind]: as a library the
-- prelude's upvalues outlive a call, and a worker sends the same text call
-- after call. A derived value is shared by later calls: never changed.
local MEMO, MEMO_KEPT = {}, 64
local function memo(kind, text, derive)
  local m = MEMO[kind]
  if m == nil or m[0] >= MEMO_KEPT then m = {[0] = 0}; MEMO[kind] = m end
  local d = m[text]
  if d == nil then
    d = derive(text)
    m[text], m[0] = d, m[0] + 1
  end
  return d
end

-- The workers' channel (notify): on a cluster the breaker's sharded one, else the
-- database's '<prefix>:notices:<db>' (the prefix's channel without ':events').
local function channels(argv2)
  local channel, db, shard = string.match(argv2, '^(%S+) (%d+) ?(%S*)$')
  local workers = shard ~= '' and shard or (string.sub(channel, 1, -8) .. ':notices:' .. db)
  return {channel, tonumber(db), shard, workers}
end

-- The keys' use is stamped this often (ttl_at), and keys left with a TTL by an
-- older version lose it: a quarter of the TTL, at most once a minute.
local function ttls(argv4)
  local ttl = tonumber(argv4)
  return {ttl, math.min(60000, math.floor(ttl / 4))}
end

-- tostring for a bucket id, kept the same way (Lua formats a number with sprintf)
local STRS, STRS_N = {}, 0
local function str(n)
  local x = STRS[n]
  if x == nil then
    x = tostring(n)
    if STRS_N >= NUMS_KEPT then STRS, STRS_N = {}, 0 end
    STRS[n], STRS_N = x, STRS_N + 1
  end
  return x
end

local function begin(keys, argv)
  KEY_LIST, ARGS = keys, argv
  K_STATE, K_WINDOW, K_LEASES, K_CONFIG, K_STATS, K_EVENTS, K_CFG =
    keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7]
  NAME = argv[1]
  local c, t = memo(2, argv[2], channels), memo(4, argv[4], ttls)
  CHANNEL, DB, SHARD, WORKERS, TTL, TTL_REFRESH_MS = c[1], c[2], c[3], c[4], t[1], t[2]
  FLOOR, KNOWN = nil, nil  -- ARGV 6, read by caller_knows() when a call needs it (rarely)
  if argv[3] ~= '' then
    NOW = tonumber(argv[3])
  else
    local time = redis.call('TIME')
    local ms = time[2] / 1000  -- (microseconds: digits, so Lua's coercion suffices, one strtod)
    NOW = (NUMS[time[1]] or num(time[1])) * 1000 + (ms - ms % 1)
  end
  REPAIRED, EVENTS, LOST, ISO, ACK = '', '', '', nil, nil
end

-- ARGV 6 (see the header): the caller's highest epoch (FLOOR) and what it knows
-- of the state (KNOWN, or nil). Parsed only by the calls that need it: a state
-- hash created anew, or one nothing has happened to since (restore_lost).
local function parse_knows(argv6)
  local floor, state, epoch, born, open_until, forced, heard =
    string.match(argv6, '^(%d+) ([a-z_]+) (%d+) (%d+) (%d+) ([a-z-]+) ?(%l*)$')
  if floor then
    return {tonumber(floor), {state = state, epoch = tonumber(epoch), born = tonumber(born),
      open_until = tonumber(open_until), forced = forced == '-' and '' or forced, heard = heard == 'heard'}}
  end
  return {tonumber(argv6) or 0, false}
end

local function caller_knows()
  if FLOOR then return end
  local k = memo(6, ARGS[6] or '', parse_knows)
  FLOOR, KNOWN = k[1], k[2] or nil
end

local function repaired(key)
  if not string.find(',' .. REPAIRED .. ',', ',' .. key .. ',', 1, true) then
    REPAIRED = REPAIRED .. (REPAIRED == '' and '' or ',') .. key
  end
end

-- Live overrides: the config hash, in BreakerConfig names and units, written
-- by configure.lua or by hand (redis-cli HSET). Each value is held to
-- BreakerConfig's own rules: one that does not parse, is not an integer where
-- one is due, or is below the lowest allowed is skipped (the caller's value
-- stays); one above the highest allowed is clamped to it. Never fatal, never
-- unbounded. The rules are written once, where BreakerConfig declares its
-- fields (breaker_redis/config.py LIVE_FIELDS); breaker_redis/lua_rules.py writes
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
  --@LIVE_RULES@ (BreakerConfig's fields, written here by breaker_redis/lua_rules.py)
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
  -- (breaker_redis/config.py): cap = max(300 s, open), open = min(30 s, cap)
  if open_set and not cap_set then c.max_open_ms = math.max(CAP_FLOOR_MS, c.open_ms) end
  if cap_set and not open_set then c.open_ms = math.min(OPEN_MS, c.max_open_ms) end
  c.bucket_ms = math.max(1, math.floor(window_ms / c.buckets))
  c.max_open_ms = math.max(c.max_open_ms, c.open_ms)
  if c.min_rep == 1 then c.min_rep = nil end  -- absent unless above 1 (see "One sick host")
  return c
end

-- The caller's config (ARGV 5) with the live overrides applied. The config
-- hash is read on every call, so a value written with redis-cli holds from
-- the next script any worker runs (an empty hash costs one short command).
--
-- As a Function library (breaker_redis/scripts.py library) this prelude's
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

-- A numeric field x (false when missing) that is there but not a finite
-- number, n being tonumber(x): the hash was edited. Beyond 2^53 no worker
-- wrote it (and inf, nan are no numbers).
local function unparsable(x, n)
  return x and (n == nil or n ~= n or n > 9007199254740991 or n < -9007199254740991)
end

local transition, stat, drop_probes  -- defined below; load_state restores with them
local EVENTS_KEPT = 10  -- what `breaker-redis show` prints (breaker_redis/reader.py EVENTS_KEPT)

-- The newest line of the events list (see transition), as a state to restore
-- from; nil if there is none or it does not parse.
local function last_transition()
  local line = redis.call('LINDEX', K_EVENTS, 0)
  if type(line) ~= 'string' then return nil end
  local to, epoch, open_until, forced = string.match(line, '^%d+ [a-z_]+ ([a-z_]+) [a-z_]+ (%d+) (%d+) ([a-z-]+)$')
  if not to then return nil end
  return {state = to, epoch = tonumber(epoch), born = -1, open_until = tonumber(open_until),
    forced = forced == '-' and '' or forced, source = 'events'}
end

-- A state Redis lost: its keys were evicted (an evicting maxmemory-policy),
-- flushed or deleted, and created anew, here (created) or by a worker that
-- knew nothing (then nothing has happened to the new one since: epoch ==
-- born). What it was comes from the caller's knowledge (KNOWN), or, when the
-- hash is created here, from the breaker's last transition (the events list,
-- another key, which may well have survived) when that is newer (a higher
-- epoch: the caller may not have heard of the last transition). A new
-- incarnation that restores nothing leaves a line in the history (see
-- mark_created), so an older line is never taken for its state later.
-- An open, half-open or forced state is restored (a transition, cause
-- 'restored', so every worker hears of it): an open breaker stays open until
-- the open_until it had, for a worker that starts now too. A caller that
-- knew it closed can restore nothing (the window's counts are gone). A loss
-- is counted once per new incarnation (stats state_lost) and the reply says
-- so, for the worker to log it.
-- What a caller only heard of (ARGV 6 ' heard': a transition message naming this
-- database, about a later incarnation than the one Redis last replied to it
-- about) is restored only over an incarnation created after the one the message
-- is about. So the incarnation has changed since the caller's last reply: the
-- keys were lost. A message (forged, say) about a later incarnation than the
-- current one restores nothing, and one about an earlier incarnation than the
-- caller's last reply is not offered (knowledge.Memory.floor_arg).
local function restore_lost(s, created)  -- true when it restored a state
  -- the common case, decided on the state alone: a breaker that made a transition since
  -- its hash was created, is not closed, or is held by an operator restores nothing
  if s.epoch ~= s.born or s.state ~= 'closed' or s.forced ~= '' or s.held == s.born then return false end
  caller_knows()
  local was = KNOWN
  if created then
    local line = last_transition()
    if line and (was == nil or line.epoch > was.epoch) then was = line end
  end
  if was == nil or s.epoch ~= s.born or was.born == s.born or s.state ~= 'closed' or s.forced ~= ''
    or s.held == s.born  -- an operator has acted on this incarnation: theirs is the last word
    or (was.heard and was.born > s.born) then
    return false
  end
  local repair = s.lost == s.born  -- created by a repair (logged as one), not counted as a loss
  local restorable = was.state ~= 'closed' or was.forced ~= ''
  if not repair and (restorable or was.source == nil) then
    s.lost, s.dirty = s.born, true
    stat('state_lost', 1)
  end
  if not restorable then
    if not repair and was.source == nil then LOST = 'lost' end
    return false
  end
  if not repair then LOST = was.source == 'events' and 'restored_events' or 'restored' end
  local to = was.state
  if was.forced ~= '' then to = was.forced end
  s.forced, s.consec, s.ho_ok = was.forced, 0, 0
  s.open_until = (to == 'open' and was.forced == '') and was.open_until or 0
  if to == 'half_open' then drop_probes() end  -- an earlier incarnation's: their results are stale
  -- above every epoch the caller saw (a worker that knew nothing may have created the
  -- new hash from a lower floor), so epochs never go backwards for anyone
  s.epoch = math.max(s.epoch, FLOOR, was.epoch)
  transition(s, to, 'restored')
  return true
end

-- A new incarnation that restored nothing: a line in the history, when there is
-- one, so its last line no longer says what a lost incarnation was (no
-- transition: nothing changed for any worker, and no epoch is spent).
local function mark_created(s)
  if redis.call('EXISTS', K_EVENTS) == 0 then return end
  redis.call('LPUSH', K_EVENTS, string.format('%d lost closed created %d 0 -', NOW, s.epoch))
  redis.call('LTRIM', K_EVENTS, 0, EVENTS_KEPT - 1)
end

-- The state hash's fields, read in this order by load_state, written by save_state.
local STATE_FIELDS = {'state', 'epoch', 'open_until', 'forced', 'consec', 'open_ms', 'ho_ok', 'seq',
  'ttl_at', 'born', 'armed', 'arms', 'lost', 'held'}

-- State: a missing or corrupted hash reads as a fresh closed breaker whose
-- epoch starts above every epoch handed out before (see ARGV 6), so a worker
-- never mistakes the new breaker's results for old ones or the reverse.
-- restore: acquire and record restore a lost state the caller knows (restore_lost).
local function load_state(restore)
  local v = redis.call('HMGET', K_STATE, unpack(STATE_FIELDS))
  local N = NUMS  -- N[x] or num(x): a value the memo has costs no call
  local epoch, open_until, consec = N[v[2]] or num(v[2]), N[v[3]] or num(v[3]), N[v[5]] or num(v[5])
  local open_ms, ho_ok, seq = N[v[6]] or num(v[6]), N[v[7]] or num(v[7]), N[v[8]] or num(v[8])
  local ttl_at, born, arms = N[v[9]] or num(v[9]), N[v[10]] or num(v[10]), N[v[12]] or num(v[12])
  local lost, held = N[v[13]] or num(v[13]), N[v[14]] or num(v[14])
  local s = {state = v[1], epoch = epoch or 0, open_until = open_until or 0,
    forced = v[4] or '', consec = consec or 0, open_ms = open_ms or 0,
    ho_ok = ho_ok or 0, seq = seq or 0, ttl_at = ttl_at or 0,
    born = born or 0, armed = v[11] == '1', arms = arms or 0, lost = lost or 0,
    held = held or 0, dirty = false, was = v}
  -- a numeric field that is there but not a finite number: the hash was edited; start afresh
  -- (the common case, every one of them there and in range, decided without a call)
  local M = 9007199254740991
  local corrupted = false
  if not (epoch and open_until and consec and open_ms and ho_ok and seq and born and arms
    and epoch <= M and epoch >= -M and open_until <= M and open_until >= -M and consec <= M and consec >= -M
    and open_ms <= M and open_ms >= -M and ho_ok <= M and ho_ok >= -M and seq <= M and seq >= -M
    and born <= M and born >= -M and arms <= M and arms >= -M) then
    corrupted = unparsable(v[2], epoch) or unparsable(v[3], open_until) or unparsable(v[5], consec)
      or unparsable(v[6], open_ms) or unparsable(v[7], ho_ok) or unparsable(v[8], seq) or unparsable(v[10], born)
      or unparsable(v[12], arms)
  end
  if corrupted or (v[1] and v[1] ~= 'closed' and v[1] ~= 'open' and v[1] ~= 'half_open') then
    repaired('state')
  end
  local created = corrupted or (s.state ~= 'closed' and s.state ~= 'open' and s.state ~= 'half_open')
  if created then
    if unparsable(v[2], epoch) then s.epoch = 0 end
    caller_knows()
    s.epoch = math.max(NOW, FLOOR + 1, s.epoch + 1)
    s.state, s.born, s.armed, s.dirty = 'closed', s.epoch, false, true
    s.open_until, s.consec, s.open_ms, s.ho_ok, s.seq, s.arms, s.forced = 0, 0, 0, 0, 0, 0, ''
    s.lost = v[1] and s.born or 0  -- a repair is logged as one (REPAIRED), not counted as a loss
    s.was = nil  -- written whole
  end
  -- was (the HMGET reply itself: one table fewer per call): the fields as stored, for
  -- save_state to compare, the numbers parsed (nil: missing) and the armed flag as a
  -- boolean (anything but '1' or '0' stays a string, never equal: it is rewritten)
  v[2], v[3], v[5], v[6], v[7], v[8], v[9], v[10], v[12], v[13], v[14] =
    epoch, open_until, consec, open_ms, ho_ok, seq, ttl_at, born, arms, lost, held
  if v[11] == '1' then v[11] = true elseif v[11] == '0' then v[11] = false end
  if s.forced ~= 'open' and s.forced ~= 'closed' then s.forced = '' end
  if restore and not restore_lost(s, created) and created then mark_created(s) end
  return s
end

-- Whether a result admitted under `epoch` belongs to the current state: the
-- same epoch, or one from before the hash was created anew while nothing has
-- happened since (its keys vanished; the fresh breaker made no transition).
local function current_epoch(s, epoch)
  return epoch == s.epoch or (epoch ~= nil and epoch < s.born and s.epoch == s.born)
end

-- Writes the fields of the state that changed (a failure that only counts one more
-- in a run writes `consec` alone), and stamps the keys' use once a minute (ttl_at,
-- for sweep.lua), dropping any TTL an older version gave them. The whole hash, the
-- writer's key TTL (ttl) and the config copy (cfg) are written when the hash is
-- created, at the stamp and at a transition.
local SCRATCH = {}  -- the fields a write sends (save_state, window_add), kept: one table fewer per call
local function save_state(s)
  local stamp = NOW - s.ttl_at >= TTL_REFRESH_MS or NOW < s.ttl_at
  if stamp then
    s.ttl_at, s.dirty = NOW, true
    for i = 1, 6 do redis.call('PERSIST', KEY_LIST[i]) end  -- cfg: rewritten below
  end
  if not s.dirty then return end
  local whole = stamp or s.was == nil or EVENTS ~= ''
  local was, f, n = s.was or {}, SCRATCH, 0
  for i = 1, #STATE_FIELDS do  -- (not ipairs: a C call per field)
    local value = s[STATE_FIELDS[i]]
    if whole or was[i] ~= value then
      if value == true then value = '1' elseif value == false then value = '0' end  -- armed
      f[n + 1], f[n + 2], n = STATE_FIELDS[i], value, n + 2
    end
  end
  if whole then f[n + 1], f[n + 2], n = 'ttl', TTL, n + 2 end
  if n > 0 then redis.call('HSET', K_STATE, unpack(f, 1, n)) end
  -- the caller's config, for readers that have none (the CLI's `show`): at least once a
  -- minute while a worker runs. A key of its own: in the state hash, a value this long
  -- would make Redis store the hash less compactly
  if whole and ARGS[5] ~= '' then redis.call('SET', K_CFG, ARGS[5]) end
end

-- A counter that does not parse (the hash was edited) starts again from `by`.
stat = function(field, by)
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

-- What a worker counted in memory arrives here in batches, from ARGV[from]
-- on: rejections and would_reject decided from memory, then the outcomes of
-- calls it admitted in observe mode while the breaker was open (they decide
-- nothing: only an acquire-script probe decides half_open).
local PENDING = {'rejected', 'would_reject', 'successes', 'failures', 'ignored', 'slow'}
local function flush_pending(from)
  for i = 1, 6 do
    local raw = ARGS[from + i - 1]
    if raw ~= '0' and raw ~= '' then  -- usually: nothing counted (a string compare, no parse)
      local n = tonumber(raw)
      if n and n ~= 0 then stat(PENDING[i], n) end
    end
  end
end

-- One message to everyone who reads the events: PUBLISH on <prefix>:events (the CLI's
-- events --follow, the dashboard, anyone's redis-cli), and on the workers' channel
-- (WORKERS: '<prefix>:notices:<db>', or on Redis Cluster the breaker's own sharded channel,
-- SPUBLISH, which only its master's subscribers hear).
local function announce(message)
  redis.call('PUBLISH', CHANNEL, message)
  if SHARD ~= '' then return redis.call('SPUBLISH', SHARD, message) end
  return redis.call('PUBLISH', WORKERS, message)
end

-- A notice the caller waits for (docs/boundary.md, "The boundary"): the message carries
-- this call's token, every worker that reads it on the workers' channel counts it in
-- <prefix>:{NAME}:acks (HINCRBY <token> 1) once it has applied it, and the reply's last
-- field, '<token> <workers>', tells the caller how many to wait for: as many as the
-- PUBLISH (SPUBLISH) reached. Only workers listen there, so a dashboard or a redis-cli
-- watching <prefix>:events is not waited for. The hash expires a minute after its last
-- notice; a token is the time and a count kept there, so none is ever used twice.
local ACKS_TTL_MS = 60000
local function notify(msg)
  if ACK == nil then
    local acks = string.sub(K_STATE, 1, -6) .. 'acks'  -- '<prefix>:{NAME}:state' -> ...:acks
    local seq = redis.pcall('HINCRBY', acks, ' seq', 1)
    if type(seq) == 'table' then  -- another type, written there by hand
      redis.call('DEL', acks)
      seq = redis.call('HINCRBY', acks, ' seq', 1)
    end
    redis.call('PEXPIRE', acks, ACKS_TTL_MS)
    ACK = {string.format('%d-%d', NOW, seq), 0}
  end
  msg.ack = ACK[1]
  ACK[2] = ACK[2] + announce(cjson.encode(msg))
end

-- Every transition: epoch+1, one line in the events list, one pub/sub message. Messages
-- are hints: a worker that hears one asks Redis again before trusting memory.
local function publish(s, kind, extra)
  local msg = {name = NAME, kind = kind, epoch = s.epoch, arms = s.arms, born = s.born, db = DB, at = NOW}
  for k, v in pairs(extra or {}) do msg[k] = v end
  notify(msg)
end

transition = function(s, to, cause)
  local from = s.state
  s.state, s.epoch, s.armed, s.dirty = to, s.epoch + 1, false, true
  local line = string.format('%d %s %s %s %d %d %s', NOW, from, to, cause, s.epoch, s.open_until,
    s.forced ~= '' and s.forced or '-')
  local pushed = redis.pcall('LPUSH', K_EVENTS, line)
  if type(pushed) == 'table' and pushed.err then
    if not string.find(tostring(pushed.err), 'WRONGTYPE', 1, true) then error(pushed) end
    redis.call('DEL', K_EVENTS)  -- another type, written there by hand
    repaired('events')
    redis.call('LPUSH', K_EVENTS, line)
  end
  redis.call('LTRIM', K_EVENTS, 0, EVENTS_KEPT - 1)
  publish(s, 'transition', {from = from, to = to, open_until = s.open_until, forced = s.forced, cause = cause})
  EVENTS = EVENTS .. (EVENTS == '' and '' or ',') .. from .. '>' .. to .. ':' .. cause
end

-- Leases. Probe leases exist only in half_open; leaving it drops them.
local function probe_ids()
  local ids = {}
  for _, m in ipairs(redis.call('ZRANGE', K_LEASES, 0, -1)) do
    if string.sub(m, 1, 2) == 'p:' then ids[#ids + 1] = m end
  end
  return ids
end

drop_probes = function()
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

-- Window: buckets of bms ms; bucket ids in (head - nb, head] are live.
-- Its shape (bms, nb) is the caller's, or, while two configs overlap (a
-- rolling deploy), the shape it already has: a caller with another shape
-- adopts the stored one as long as a caller of that shape wrote it in the
-- last WINDOW_CLAIM_MS (sat: when), so the window is kept rather than wiped
-- by each config in turn; once no one claims it, the next caller's shape
-- replaces it (one reset). Every caller applies its own thresholds to it.
-- Returns the totals as of NOW, the current bucket's counters, the ids that
-- slid out (for the writer to drop), the shape in use and whether the hash
-- starts afresh.
local WINDOW_CLAIM_MS = 60000
-- with_f, with_s: whether the current bucket's f (s) is read, for a caller that
-- adds to it or judges a rate by it (see window_add); otherwise it reads as 0.
-- A success, a batch, a snapshot read neither (a field missing from the hash
-- costs a scan of all of it).
local function window_read(c, with_f, with_s)
  local bms, nb = c.bucket_ms, c.buckets
  local q = NOW / bms
  local cur = q - q % 1  -- math.floor without a call
  local sid = str(cur)  -- one number formatting, not three
  local w
  -- w: head, bms, tc, tf, ts, c, nb, sat, then f and s of the current bucket (nil when not read:
  -- the reply's own table is not grown for them)
  if with_f and with_s then
    w = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'tc', 'tf', 'ts', 'c' .. sid, 'nb', 'sat', 'f' .. sid,
      's' .. sid)
  elseif with_f then
    w = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'tc', 'tf', 'ts', 'c' .. sid, 'nb', 'sat', 'f' .. sid)
  elseif with_s then
    w = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'tc', 'tf', 'ts', 'c' .. sid, 'nb', 'sat', 's' .. sid)
    w[9], w[10] = false, w[9]
  else
    w = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'tc', 'tf', 'ts', 'c' .. sid, 'nb', 'sat')
  end
  local N = NUMS  -- N[x] or num(x): as in load_state
  local head, tc = N[w[1]] or num(w[1]), N[w[3]] or num(w[3]) or 0
  local tf, ts = N[w[4]] or num(w[4]) or 0, N[w[5]] or num(w[5]) or 0
  local sbms, snb = N[w[2]] or num(w[2]), N[w[7]] or num(w[7]) or nb  -- a hash from before nb was written: ours
  local adopted = false
  if head and (sbms ~= bms or snb ~= nb) then
    local sane = sbms and sbms >= 1 and sbms == math.floor(sbms) and snb >= 1 and snb <= 100
      and snb == math.floor(snb)
    local claimed = (tonumber(w[8]) or -math.huge) > NOW - WINDOW_CLAIM_MS
    if sane and claimed then
      bms, nb, adopted = sbms, snb, true
      cur = math.floor(NOW / bms)
      local b = redis.call('HMGET', K_WINDOW, 'c' .. cur, 'f' .. cur, 's' .. cur)
      w[6], w[9], w[10] = b[1], b[2], b[3]
    end
  end
  -- a head more than a day ahead of the clock was not written by a worker (a clock
  -- step back counts into the head bucket, below): the window would never slide
  local edited = (w[1] and not head) or (head and (head - cur) * bms > 86400000)
  if edited then repaired('window') end
  if head == nil or edited or (not adopted and (sbms ~= bms or snb ~= nb)) or tc < 0 or tf < 0 or ts < 0
    or cur - nb >= head then
    return {cur = cur, tc = 0, tf = 0, ts = 0, bc = 0, bf = 0, bs = 0, bms = c.bucket_ms, nb = c.buckets,
      adopted = false, reset = true}
  end
  if cur < head then -- a clock step back counts into the head bucket
    cur = head
    local b = redis.call('HMGET', K_WINDOW, 'c' .. cur, 'f' .. cur, 's' .. cur)
    w[6], w[9], w[10] = b[1], b[2], b[3]
  end
  -- Buckets that slid out: ids head-nb+1 .. cur-nb. The hash is usually a
  -- listpack, where each field read or dropped by name costs a scan, and so
  -- does each field written into it. Up to two thirds of the window slid out,
  -- those buckets are read and dropped by name; beyond, one pass reads the
  -- hash, sums the buckets that stay, and the writer rebuilds it with them.
  -- Worst case with 100 full buckets (window_buckets' bound): about 0.26 ms,
  -- where either way alone costs up to about 0.45 ms (measured on Redis 7).
  local gone, kept = nil, nil
  if (cur - head) * 3 > nb * 2 then
    local all = redis.call('HGETALL', K_WINDOW)
    local totals = {c = 0, f = 0, s = 0}
    kept = {}
    local fcur, scur = 'f' .. cur, 's' .. cur
    for i = 1, #all, 2 do
      if all[i] == fcur then w[9] = all[i + 1] elseif all[i] == scur then w[10] = all[i + 1] end
      local kind, id = string.sub(all[i], 1, 1), tonumber(string.sub(all[i], 2))
      if id and totals[kind] and id > cur - nb and id <= head then
        local value = tonumber(all[i + 1]) or 0
        totals[kind] = totals[kind] + value
        kept[#kept + 1], kept[#kept + 2] = all[i], value
      end
    end
    tc, tf, ts = totals.c, totals.f, totals.s
  else
    for id = head - nb + 1, cur - nb do
      gone = gone or {}
      local n, sid = #gone, tostring(id)
      gone[n + 1], gone[n + 2], gone[n + 3] = 'c' .. sid, 'f' .. sid, 's' .. sid
    end
    if gone then
      local b = redis.call('HMGET', K_WINDOW, unpack(gone))
      for i = 1, #gone, 3 do
        tc, tf, ts = tc - (tonumber(b[i]) or 0), tf - (tonumber(b[i + 1]) or 0), ts - (tonumber(b[i + 2]) or 0)
      end
    end
  end
  return {cur = cur, tc = tc < 0 and 0 or tc, tf = tf < 0 and 0 or tf, ts = ts < 0 and 0 or ts,
    bc = N[w[6]] or num(w[6]) or 0, bf = w[9] and (N[w[9]] or num(w[9])) or 0,
    bs = w[10] and (N[w[10]] or num(w[10])) or 0, gone = gone,
    kept = kept, sat = N[w[8]] or num(w[8]), head = head, bms = bms, nb = nb, adopted = adopted, reset = false}
end

-- The counts of the window's oldest bucket, the next to slide out (c, f, s), or
-- nil when the window is one bucket or starts afresh. For update_armed: sliding
-- raises a rate when the oldest bucket was healthier than the rest.
local function oldest_bucket(w)
  if w.reset or w.nb < 2 then return nil end
  local id = w.cur - w.nb + 1
  if id > w.head then return nil end  -- nothing was counted before the current bucket
  local b = redis.call('HMGET', K_WINDOW, 'c' .. id, 'f' .. id, 's' .. id)
  return {c = num(b[1]) or 0, f = num(b[2]) or 0, s = num(b[3]) or 0}
end

local SAT_EVERY_MS = 5000  -- a shape's claim (sat) is renewed this often, well within WINDOW_CLAIM_MS
local function window_add(c, calls, failures, slows)
  -- f and s as they are where they are written here or judged (slide_may_arm: the rate
  -- rule by f, the slow-call rule by s) once this call adds to the bucket
  local w = window_read(c, failures ~= 0 or (slows ~= 0 and c.trip == 'rate'),
    slows ~= 0 or (failures ~= 0 and c.slow_ms > 0))
  local fresh = w.reset or w.kept ~= nil  -- the hash is written anew
  if fresh then redis.call('DEL', K_WINDOW) end
  if w.gone then redis.call('HDEL', K_WINDOW, unpack(w.gone)) end
  if w.kept and #w.kept > 0 then redis.call('HSET', K_WINDOW, unpack(w.kept)) end
  local sid = str(w.cur)
  w.tc, w.tf, w.ts = w.tc + calls, w.tf + failures, w.ts + slows
  -- Only the fields that change (a missing one reads as 0): a success in the
  -- current bucket writes two, where every field each time cost the record
  -- script a third of its server time.
  local f, n = SCRATCH, 4  -- (unpack(f, 1, n): only what this call put there is sent)
  f[1], f[2], f[3], f[4] = 'tc', w.tc, 'c' .. sid, w.bc + calls
  if fresh or w.head ~= w.cur then f[n + 1], f[n + 2], n = 'head', sid, n + 2 end
  if fresh then f[n + 1], f[n + 2], f[n + 3], f[n + 4], n = 'bms', w.bms, 'nb', w.nb, n + 4 end
  if fresh or failures ~= 0 or w.gone then f[n + 1], f[n + 2], n = 'tf', w.tf, n + 2 end  -- a slide changes it
  if fresh or slows ~= 0 or w.gone then f[n + 1], f[n + 2], n = 'ts', w.ts, n + 2 end
  if fresh or failures ~= 0 then f[n + 1], f[n + 2], n = 'f' .. sid, w.bf + failures, n + 2 end
  if fresh or slows ~= 0 then f[n + 1], f[n + 2], n = 's' .. sid, w.bs + slows, n + 2 end
  if w.adopted then  -- the shape is another caller's: its claim is kept as it was
    if w.kept and w.sat then f[n + 1], f[n + 2], n = 'sat', w.sat, n + 2 end
  elseif fresh or not w.sat or NOW - w.sat >= SAT_EVERY_MS or NOW < w.sat then
    f[n + 1], f[n + 2], n = 'sat', NOW, n + 2  -- this shape claimed
  end
  redis.call('HSET', K_WINDOW, unpack(f, 1, n))
  return w
end

-- Armed: closed, and a success reaching Redis late could change a decision.
-- Workers batch successes only while calm, and a failure (every outcome but a
-- plain success) always goes at once carrying the worker's batch; the calm->armed
-- change is published, so every worker sends its batch and then every outcome at
-- once (docs/boundary.md, "Calm and armed", states the guarantee):
-- - consecutive rule: armed while the run of failures is above 0 (a success ends it);
-- - rate and slow-call rules: armed while REACH more failures (slow calls) could
--   make the rule hold, on the window as it is and as it will be once its oldest
--   bucket slid out (a slide can raise a rate between two records); far from its
--   threshold the breaker stays calm, so a background error rate costs one record
--   per failure and nothing per success. Once armed it calms again only beyond
--   twice that reach, so a rate hovering at the edge does not arm again and again.
-- The count rule ignores successes, so only its slow-call rule arms it.
local REACH = 20
local function within_reach(c, tc, tf, ts, k)
  if tc + k < c.min_calls then return false end
  return (c.trip == 'rate' and tf + k >= c.rate * (tc + k))
    or (c.slow_ms > 0 and ts + k >= c.slow_rate * (tc + k))
end

-- Whether sliding out the older buckets could bring the rule within reach: at
-- most it takes out every call of theirs that is not a failure (not slow). When
-- not, the oldest bucket is not read (the common case: a busy current bucket).
local function slide_may_arm(c, w, k)
  if w.reset or w.tc + k < c.min_calls then return false end
  local older = w.tc - w.bc
  local tc_rate = w.tc - math.max(0, older - (w.tf - w.bf))
  local tc_slow = w.tc - math.max(0, older - (w.ts - w.bs))
  return (c.trip == 'rate' and w.tf + k >= c.rate * (tc_rate + k))
    or (c.slow_ms > 0 and w.ts + k >= c.slow_rate * (tc_slow + k))
end

local function update_armed(s, c, w)
  local armed = false
  if s.state == 'closed' and s.forced == '' then
    if c.trip == 'consecutive' and s.consec > 0 then
      armed = true
    elseif c.trip == 'rate' or c.slow_ms > 0 then
      local k = s.armed and 2 * REACH or REACH
      armed = within_reach(c, w.tc, w.tf, w.ts, k)
      if not armed and slide_may_arm(c, w, k) then
        local old = oldest_bucket(w)
        armed = old ~= nil and within_reach(c, w.tc - old.c, w.tf - old.f, w.ts - old.s, k)
      end
    end
  end
  if armed == s.armed then return end
  s.armed, s.dirty = armed, true
  if armed then
    s.arms = s.arms + 1
    publish(s, 'armed', nil)
    EVENTS = EVENTS .. (EVENTS == '' and '' or ',') .. 'armed'
  end
end

-- Which trip rule holds for these window totals and consecutive count (nil: none).
local function trip_cause(c, w, consec)
  if c.trip == 'consecutive' and consec >= c.threshold then return 'consecutive' end
  if c.trip == 'count' and w.tf >= c.threshold then return 'count' end
  if c.trip == 'rate' and w.tc >= c.min_calls and w.tf / w.tc >= c.rate then return 'rate' end
  if c.slow_ms > 0 and w.tc >= c.min_calls and w.ts / w.tc >= c.slow_rate then return 'slow' end
  return nil
end

-- Open: the first trip for exactly open_seconds; a trip after a failed
-- half-open multiplies the last period by the backoff (capped) and adds up
-- to 10% jitter derived from the time and epoch, so breakers spread out.
-- The period after a failed probe: the last one (last_ms) times the backoff, capped, and
-- with up to 10% jitter (base, with jitter).
local function backed_off(c, last_ms, epoch)
  local base = math.min(math.floor(math.max(last_ms, c.open_ms) * c.backoff), c.max_open_ms)
  return base, base + math.floor(base * (((NOW % 997) * 31 + epoch * 17) % 100) / 1000)
end

local function trip_open(s, c, cause, after_half_open)
  local base, dur = c.open_ms, c.open_ms
  if after_half_open then
    base, dur = backed_off(c, s.open_ms, s.epoch)
    drop_probes()
  end
  s.open_ms, s.open_until, s.consec, s.ho_ok = base, NOW + dur, 0, 0
  transition(s, 'open', cause)
  stat('trips', 1)
end

-- Breaker groups (see group_holds_back below): a member's grant, the `grant` field of its
-- state hash, and `revoked`, the highest token taken back (every token up to it is dead:
-- member.lua refuses it). Tokens are integers (group.lua hands them out above the clock); a
-- field that is not one was edited by hand: nil, and the caller repairs it.
local MAX_TOKEN = 9007199254740991
local function token_of(x)
  if type(x) ~= 'string' or not string.find(x, '^%d+$') then return nil end
  local n = tonumber(x)
  if n > MAX_TOKEN then return nil end
  return n
end

-- The member's grant as stored: (held, revoked), each repaired when it is not a token (a
-- grant that is not one is dropped: the member holds none, and a trip is held back until
-- the group grants one; a revoked mark that is not one is raised to the grant's token or the
-- clock, which is above every token a group handed out before this call).
local function grant_fields()
  local v = redis.call('HMGET', K_STATE, 'grant', 'revoked')
  local held, revoked = token_of(v[1]), token_of(v[2])
  if v[1] and not held then
    redis.call('HDEL', K_STATE, 'grant')
    repaired('state')
  end
  if v[2] and not revoked then
    revoked = math.max(held or 0, NOW)
    redis.call('HSET', K_STATE, 'revoked', revoked)
    repaired('state')
  end
  return held, revoked or 0
end

-- A member no longer needs its grant (it closed, or was reset or forced closed): it gives it
-- back in its own slot, so the grant is tied to the open state it was granted for. Every
-- token up to the one held is revoked (member.lua refuses them from then on) and the reply's
-- events say 'released:<revoked>', so the worker has the group forget its grant (group.lua
-- release): in that order, the group never lists fewer grants than members are open.
-- Returns the highest token revoked (0: none ever).
local function give_back_grant(token)
  local held, revoked = grant_fields()
  local upto = math.max(revoked, held or 0, token or 0)
  if held then redis.call('HDEL', K_STATE, 'grant') end
  if upto > revoked then redis.call('HSET', K_STATE, 'revoked', upto) end
  if held then EVENTS = EVENTS .. (EVENTS == '' and '' or ',') .. 'released:' .. string.format('%d', upto) end
  return upto
end

local function close(s, cause)
  s.consec, s.open_ms, s.ho_ok, s.open_until = 0, 0, 0, 0
  redis.call('DEL', K_WINDOW)
  drop_probes()
  give_back_grant(nil)  -- a member's grant: closed, it no longer needs one
  transition(s, 'closed', cause)
end

-- The reply every state-changing script gives, so a worker refreshes what it knows:
-- {allowed, reason, state, epoch, open_until, forced, lease, now, mode, max_conc, events, slow_ms,
--  armed (0/1), arms, born, repaired (the corrupted keys this call repaired, comma-separated),
-- '<token> <workers>' of this call's notices (notify), '' for none: the reply's last field.
local function ack_field()
  return ACK and string.format('%s %d', ACK[1], ACK[2]) or ''
end

--  lost ('', 'restored' or 'lost': see restore_lost), until when the calling reporter is
--  isolated (min_reporters > 1; 0 when it is not), ack ('<token> <workers>' when this call
--  published a notice: see notify; '' when not)}
local function reply(s, allowed, reason, lease, c)
  save_state(s)
  return {allowed, reason, s.state, s.epoch, s.open_until, s.forced, lease, NOW,
    c and c.mode or '', c and c.max_conc or 0, EVENTS, c and c.slow_ms or 0, s.armed and 1 or 0, s.arms,
    s.born, REPAIRED, LOST, ISO or 0, ack_field()}
end

-- Breaker groups: a pool of replica hosts of which at most a share may be open at
-- once (breaker_redis/groups.py; Envoy's max_ejection_percent). A member's config
-- names its group (c.group); it opens only holding the group's grant, the field
-- 'grant' of its state hash, which member.lua writes once group.lua, in the group's
-- own slot, handed out one of the group's few grants (docs/http-clients.md has why it
-- is two steps). Without one, a trip its rules call for is held back: the breaker
-- stays closed and keeps counting, and the reply's events say 'held', so the worker
-- asks the group and, granted, has member.lua trip it. Not in a group: nothing read.
local function group_holds_back(s, c)
  if not c.group or grant_fields() then return false end
  EVENTS = EVENTS .. (EVENTS == '' and '' or ',') .. 'held'
  return true
end

-- One sick host: a quorum of reporters before a shared trip, and a sick reporter isolated
-- instead (README and docs/boundary.md, "One sick host"). Only with min_reporters above 1
-- (the config's min_rep, absent when 1, so nothing below runs by default). Every worker
-- names its reporter (its host by default): record.lua ARGV 19, acquire.lua ARGV 13.
--   reporters HASH <prefix>:{NAME}:reporters (the state key's hash tag: the same slot),
--     a field per reporter that failed in the window or is isolated, its value
--     'since last f c rc run' while it fails: its own window (f failures in c calls since
--     `since`, its first failure less than a window ago), its last failure, its own run of
--     failures (rc: a success of its own ends it, not a batch of
--     them, which may have happened before: record.lua) and the shared run it last failed in;
--     ' till period probe' appended while it is isolated (till: until when; period: the
--     isolation's length, for the backoff; probe: its probe lease's expiry, 0 for none).
--     Times are ms, those after `since` relative to it. Field ' run': the number of the
--     shared run of failures (consecutive rule); field ' n': at least the records in the hash
--     (at most REP_CAP, see below). The key expires a window after the last
--     failure it records (or after an isolation ends): a reporter that stops failing
--     leaves nothing behind.
-- The shared rule (count, rate, consecutive) trips only when the reporters failing in
-- the window (consecutive rule: in the run that reached the threshold), the isolated ones
-- included, are at least min_rep. A reporter whose own outcomes meet the rule while the
-- quorum does not is isolated: acquire.lua refuses its calls (reason 'isolated') until
-- `till`, then gives it one probe of its own; the probe's success ends the isolation, its
-- failure (or its lease expiring) isolates it again with the backoff. Each change bumps
-- the state's `arms` (so replies before and after it are ordered, knowledge.py rank),
-- is published (kind 'isolation') and listed in the reply's events.
local function rep_key()
  return string.sub(K_STATE, 1, -6) .. 'reporters'  -- '<prefix>:{NAME}:state' -> ...:reporters
end

-- A record as the scripts use it (times absolute, ms), or nil for no record; and true when
-- the field is there but corrupted (edited by hand, or by a bug): not a record a worker
-- wrote (digits and single spaces, 6 or 9 numbers, each at most 2^53), so the writing
-- scripts drop it (rep_drop_corrupt) and the readers skip it. Every number of a record
-- that parses is held to what a worker could have written, so no hand-edited value can
-- make a script fail or keep a record for ever: its times no later than now (its
-- isolation and probe no longer than the config allows from now), its failures at most
-- its calls, its own run at most 2^31, its period at most max_open_seconds.
local REP_MAX, REP_COUNT_MAX = 9007199254740991, 2147483647
local function rep_parse(v, c)
  if type(v) ~= 'string' then return nil, false end
  if not string.find(v, '^%d+ %d+ %d+ %d+ %d+ %d+$') and not string.find(v, '^%d+ %d+ %d+ %d+ %d+ %d+ %d+ %d+ %d+$')
  then return nil, true end
  local n = {}
  for x in string.gmatch(v, '%d+') do
    local d = tonumber(x)
    if d > REP_MAX then return nil, true end
    n[#n + 1] = d
  end
  local since = math.min(n[1], NOW)
  local r = {since = since, last = math.min(since + n[2], NOW), c = math.min(n[4], REP_COUNT_MAX), rc =
    math.min(n[5], REP_COUNT_MAX), run = n[6], iso = #n == 9, till = 0, period = 0, probe = 0}
  r.f = math.min(n[3], r.c)
  if r.iso then
    local longest = c.max_open_ms + math.ceil(c.max_open_ms / 10)  -- backed_off's cap, with its jitter
    r.till = math.min(since + n[7], NOW + longest)
    r.period = math.min(n[8], c.max_open_ms)
    r.probe = n[9] > 0 and math.min(since + n[9], NOW + c.probe_ms) or 0
  end
  return r, false
end

-- acquire.lua, record.lua: a corrupted record found is dropped (and the key reported repaired).
local function rep_drop_corrupt(key, name, corrupt)
  if corrupt then
    redis.call('HDEL', key, name)
    repaired('reporters')
  end
end

local function rep_format(r)
  local v = string.format('%d %d %d %d %d %d', r.since, math.max(0, r.last - r.since), r.f, r.c, r.rc, r.run)
  if not r.iso then return v end
  return v .. string.format(' %d %d %d', math.max(0, r.till - r.since), r.period,
    r.probe > 0 and math.max(1, r.probe - r.since) or 0)
end

-- Until when a record counts (and is kept): a window after its last failure; an isolated
-- reporter's, a window after its isolation's end or its probe's lease, whichever is later.
local function rep_until(c, r)
  local window = c.bucket_ms * c.buckets
  if r.iso then return math.max(r.till + window, r.probe) end
  return r.last + window
end

-- A reporter's own outcomes meet the shared rule (its own window, or its own run).
local function own_rule_holds(c, r)
  if c.trip == 'consecutive' then return r.rc >= c.threshold end
  if c.trip == 'count' then return r.f >= c.threshold end
  return r.c >= c.min_calls and r.f / r.c >= c.rate
end

local function isolation_changed(s, reporter, what, cause, till)
  s.arms, s.dirty = s.arms + 1, true
  publish(s, 'isolation', {reporter = reporter, what = what, cause = cause, ['until'] = till})
  EVENTS = EVENTS .. (EVENTS == '' and '' or ',') .. what .. ':' .. cause .. ':' .. reporter
end

-- Isolated for open_seconds; again (a failed probe) for the backoff's next period.
local function isolate(s, c, reporter, r, cause)
  local again, period, dur = r.iso, c.open_ms, c.open_ms
  if again then period, dur = backed_off(c, r.period, s.epoch) else stat('isolations', 1) end
  r.iso, r.till, r.period, r.probe = true, NOW + dur, period, 0
  isolation_changed(s, reporter, again and 'reisolated' or 'isolated', cause, r.till)
end

-- Until when an isolated reporter's workers refuse its calls from memory: the isolation's
-- end, or its probe's lease expiry while the probe is in flight.
local function rep_iso_until(r)
  if r.probe > NOW then return math.max(r.till, r.probe) end
  return r.till
end

-- One record written; the key lives as long as its longest-lived record.
local function rep_save(key, c, reporter, r)
  redis.call('HSET', key, reporter, rep_format(r))
  local ms = rep_until(c, r) - NOW
  if ms > redis.call('PTTL', key) then redis.call('PEXPIRE', key, math.max(1, ms)) end
end

-- acquire.lua, record.lua: the caller's reporter (ARGV; '-' for none) and its record (nil:
-- none, or no longer counting); the reply says whether it is isolated (ISO) whatever the call
-- does next, so that no reply tells one of its workers it is not. While its probe is in
-- flight it says until the probe's lease expires (rep_iso_until): the reporter's workers
-- refuse from memory until the probe's outcome is published (or its lease runs out), as
-- for an open breaker, instead of running this script for every call refused.
local function reporter_record(name, c)
  if name == nil or name == '' then name = '-' end
  local key = rep_key()
  local r, corrupt = rep_parse(redis.call('HGET', key, name), c)
  rep_drop_corrupt(key, name, corrupt)
  if r and NOW >= rep_until(c, r) then r = nil end
  if r and r.iso then ISO = rep_iso_until(r) end
  return name, r
end

-- acquire.lua, closed: may the caller's reporter go ahead? (allowed, reason, lease)
local function reporter_admits(s, c, reporter, r)
  if not r or not r.iso then return 1, '', '' end
  if NOW < r.till or r.probe > NOW then return 0, 'isolated', '' end
  local key = rep_key()
  if r.probe > 0 then  -- its probe overran probe_timeout_seconds: it failed
    isolate(s, c, reporter, r, 'probe_timeout')
    rep_save(key, c, reporter, r)
    ISO = r.till
    return 0, 'isolated', ''
  end
  r.probe = NOW + c.probe_ms
  rep_save(key, c, reporter, r)
  ISO = r.probe  -- (the reporter's other calls are refused from memory meanwhile)
  return 1, '', 'i:' .. r.probe
end

-- record.lua, closed: a success of the reporter ends its own run and counts in its rate
-- (with minimum_calls, its rate can come to hold on a success). A batch of successes
-- (batched) counts in its rate only: its successes may have happened before the failures
-- of the run (a worker sends them late: record.lua), as for the shared run.
local function reporter_succeeded(s, key, c, reporter, calls, batched)
  local r, corrupt = rep_parse(redis.call('HGET', key, reporter), c)
  rep_drop_corrupt(key, reporter, corrupt)
  if r and not r.iso and c.trip ~= 'count' and NOW < rep_until(c, r) then
    r.c, r.rc = r.c + calls, batched and r.rc or 0
    if own_rule_holds(c, r) then
      isolate(s, c, reporter, r, c.trip)
      ISO = r.till
    end
    rep_save(key, c, reporter, r)
  end
end

-- At most REP_CAP reporters are tracked per breaker (README "One sick host"), so no script's
-- work grows with the number of reporters: a failure reads the shared run's number and its
-- own record (HMGET) and writes them back; only a call that must count the reporters failing
-- (the shared rule holds) or make room for a new record reads the whole hash, at most REP_CAP
-- entries. min_reporters is at most MAX_MIN_REPORTERS (breaker_redis/base/config.py), below
-- the cap, so a quorum can always be counted. A new reporter finding the hash full takes the
-- place of the record that matters least: one not isolated and not in the shared run, else the
-- one whose last failure is oldest; with every record isolated, it is not tracked (its failures
-- still count in the shared window, and the isolated ones make the quorum).
local REP_CAP = 128

-- The live records of the hash (name -> record) and the names of those no longer counting or
-- corrupted, which the caller drops.
local function rep_scan(key, c)
  local all, recs, gone = redis.call('HGETALL', key), {}, {}
  for i = 1, #all, 2 do
    if all[i] ~= ' run' and all[i] ~= ' n' then
      local r, corrupt = rep_parse(all[i + 1], c)
      if corrupt then repaired('reporters') end
      if r and NOW < rep_until(c, r) then recs[all[i]] = r else gone[#gone + 1] = all[i] end
    end
  end
  return recs, gone
end

-- The ' run' field: the shared run's number, and whether it was corrupted (then 0).
local function rep_run(v)
  if not v then return 0, false end
  local run = string.find(v, '^%d+$') and tonumber(v) or -1
  if run < 0 or run >= REP_MAX then
    repaired('reporters')
    return 0, true
  end
  return run, false
end

-- The ' n' field: at least the records in the hash (each new one adds 1, a scan sets it to
-- the live ones; none is removed otherwise but by a scan or its own reporter's end), so the
-- hash is read whole only once it may be full, with the commands every script already runs.
-- Missing (a new hash, or one an older version wrote) or corrupted: REP_CAP, so the next new
-- reporter's scan sets it right.
local function rep_count(v)
  local n = v and string.find(v, '^%d+$') and tonumber(v)
  if not n or n > REP_CAP then return REP_CAP end
  return n
end

-- Room for a new record in a full hash (recs: the live ones, the caller's own left out):
-- false when none can be made; else the names to drop.
local function rep_room(recs, run)
  local n, spare = 0, {}
  for name, x in pairs(recs) do
    n = n + 1
    if not x.iso then spare[#spare + 1] = {name, x.run == run and 1 or 0, x.last} end
  end
  local over = n - REP_CAP + 1
  if over <= 0 then return {} end
  if #spare < over then return false end
  table.sort(spare, function(a, b)
    if a[2] ~= b[2] then return a[2] < b[2] end
    if a[3] ~= b[3] then return a[3] < b[3] end
    return a[1] < b[1]
  end)
  local out = {}
  for i = 1, over do out[i] = spare[i][1] end
  return out
end

-- record.lua, closed: the caller's outcomes (calls, of which failures; lease: the
-- permit's; batched: a batch of successes, see reporter_succeeded) with the shared rule's
-- verdict `cause` (nil: none); returns the cause to trip on, nil when the quorum holds it back.
local function quorum(s, c, cause, calls, failures, reporter, lease, batched)
  local key = rep_key()
  local probe = lease ~= '' and tonumber(string.match(' ' .. lease, ' i:(%d+)'))
  local gated = cause == 'consecutive' or cause == 'count' or cause == 'rate'
  if failures == 0 and not probe and not gated then
    if cause then  -- the slow-call rule (no quorum): open for everyone
      redis.call('DEL', key)
      ISO = nil
    else
      reporter_succeeded(s, key, c, reporter, calls, batched)
    end
    return cause
  end
  local got = redis.call('HMGET', key, ' run', ' n', reporter)
  local run, run_bad = rep_run(got[1])
  local count = rep_count(got[2])
  local r, corrupt = rep_parse(got[3], c)
  local gone = {}
  if corrupt then repaired('reporters') end
  if got[3] and (not r or NOW >= rep_until(c, r)) then r, gone[1] = nil, reporter end
  local had = r ~= nil  -- the hash holds a live record of the caller's
  local new_run = failures > 0 and s.consec == 1 and c.trip == 'consecutive'
  if new_run then run = run + 1 end
  if r and r.iso then
    if probe == r.probe and failures > 0 then
      isolate(s, c, reporter, r, 'probe_failed')
    elseif probe == r.probe then
      r = nil
      gone[#gone + 1] = reporter
      isolation_changed(s, reporter, 'recovered', 'probe_succeeded', 0)
    end  -- else a call admitted before it was isolated: nothing
  elseif failures > 0 then
    if not r or NOW - r.since >= c.bucket_ms * c.buckets then
      r = {since = NOW, last = NOW, f = 0, c = 0, rc = r and r.rc or 0, run = run, iso = false, till = 0, period = 0,
        probe = 0}
    end
    r.last, r.f, r.c, r.rc, r.run = NOW, r.f + failures, r.c + calls, r.rc + failures, run
  elseif r then
    r.c, r.rc = r.c + calls, batched and r.rc or 0
  end
  local recs  -- every live record but the caller's, read only when needed (at most REP_CAP)
  local counted = false  -- count to be written: a new record, or the records counted
  if r and not had and count + 1 >= REP_CAP then  -- a new record, and the hash may be full
    local dropped
    recs, dropped = rep_scan(key, c)
    recs[reporter] = nil
    for _, name in ipairs(dropped) do gone[#gone + 1] = name end
    local room = rep_room(recs, run)
    if room then
      for _, name in ipairs(room) do
        recs[name] = nil
        gone[#gone + 1] = name
      end
    else
      r = nil  -- every record isolated: this reporter is not tracked
    end
    count, counted = 0, true
    for _ in pairs(recs) do count = count + 1 end
    if r then count = count + 1 end
  elseif r and not had then
    count, counted = count + 1, true
  end
  if gated then
    if not recs then
      local dropped
      recs, dropped = rep_scan(key, c)
      recs[reporter] = nil
      for _, name in ipairs(dropped) do gone[#gone + 1] = name end
    end
    count, counted = r and 1 or 0, true
    for _ in pairs(recs) do count = count + 1 end
    local failing = r and (r.iso or c.trip ~= 'consecutive' or r.run == run) and 1 or 0
    for _, x in pairs(recs) do
      if x.iso or c.trip ~= 'consecutive' or x.run == run then failing = failing + 1 end
    end
    if failing < c.min_rep then cause = nil end
  end
  if cause then  -- the shared breaker opens for everyone: no isolation left
    redis.call('DEL', key)
    ISO = nil
    return cause
  end
  if r and not r.iso and own_rule_holds(c, r) then isolate(s, c, reporter, r, c.trip) end
  ISO = r and r.iso and rep_iso_until(r) or nil
  -- the key lives as long as its longest-lived record: known when read whole, else at least
  -- as long as the caller's (a record only ever extends it; one ended leaves it as it was)
  local longest = r and rep_until(c, r) or 0
  if recs then
    for _, x in pairs(recs) do longest = math.max(longest, rep_until(c, x)) end
    if longest == 0 then
      redis.call('DEL', key)
      return nil
    end
  end
  if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
  local keep = {}
  if new_run or run_bad then keep[#keep + 1], keep[#keep + 2] = ' run', run end
  if counted then keep[#keep + 1], keep[#keep + 2] = ' n', count end
  if r then keep[#keep + 1], keep[#keep + 2] = reporter, rep_format(r) end
  if #keep > 0 then redis.call('HSET', key, unpack(keep)) end
  local ms = math.max(1, (longest > 0 and longest or NOW + c.bucket_ms * c.buckets) - NOW)
  if recs or ms > redis.call('PTTL', key) then redis.call('PEXPIRE', key, ms) end
  return nil
end

-- record.lua: an ignored outcome of the reporter's probe gives the probe back; acquire.lua:
-- so does a probe the bulkhead refused (it never ran, so it cannot count as failed).
local function reporter_probe_ignored(c, reporter, r, lease)
  local probe = tonumber(string.match(' ' .. lease, ' i:(%d+)'))
  if probe and r and r.iso and r.probe == probe then
    r.probe, ISO = 0, r.till
    redis.call('HSET', rep_key(), reporter, rep_format(r))
  end
end

-- snapshot.lua, read.lua: the reporters failing in the window and the isolated ones, as
-- {name, failures in its own window, isolated until (0: not isolated), ...}.
local function reporters_view(c)
  local all, out = redis.call('HGETALL', rep_key()), {}
  for i = 1, #all, 2 do
    local r = rep_parse(all[i + 1], c)  -- a corrupted one is skipped (these scripts write none)
    if r and NOW < rep_until(c, r) then
      out[#out + 1], out[#out + 2], out[#out + 3] = all[i], r.f, r.iso and r.till or 0
    end
  end
  return out
end
