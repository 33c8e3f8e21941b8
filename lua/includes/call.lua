-- call.lua: this call's keys, its common arguments (ARGV 1-6) and its time: begin(),
-- which every script calls first, and what it sets for the call.
--
-- This call's keys and common arguments and what is derived from them, set by begin(),
-- which every script calls first; the includes below read them. Upvalues rather than
-- the KEYS and ARGV globals, so the same text runs as an EVAL script (where this
-- prelude runs on every call) and as a library of Redis Functions (loaded once; each
-- function gets its keys and arguments as parameters). A script's own arguments
-- (ARGV 7 on) are not here: each script reads them once into its table `a`.
--   KEY_LIST, ARGS   this call's KEYS and ARGV
--   K_STATE .. K_CFG the breaker's seven keys, KEYS[1..7] (lua/_lib.lua's header)
--   NAME             ARGV 1, the breaker's name
--   CHANNEL, DB      ARGV 2: the prefix's channel and the caller's database (channels)
--   SHARD, WORKERS   the sharded channel on a cluster ('' elsewhere), the workers' channel
--   NOW              ARGV 3, or Redis TIME: this call's time, ms
--   NOW_US           the same in microseconds (ARGV 3 times 1000): what the count window
--                    places batched successes by (ring.lua)
--   TTL, TTL_REFRESH_MS  ARGV 4, the key TTL, and how often the keys' use is stamped
--   FLOOR, KNOWN     ARGV 6, read when needed (caller_knows): the caller's highest epoch
--                    and what it knows of the state (nil: nothing)
local KEY_LIST, ARGS
local K_STATE, K_WINDOW, K_LEASES, K_CONFIG, K_STATS, K_EVENTS, K_CFG
local NAME, CHANNEL, DB, SHARD, WORKERS, TTL, FLOOR, KNOWN, TTL_REFRESH_MS, NOW, NOW_US
-- What this call did, for its reply (reply.lua), reset by begin():
--   REPAIRED  the keys found corrupted (a field that does not parse) and repaired, comma-
--             separated: the worker logs them, once each (repaired)
--   EVENTS    what happened: transitions, arming, isolations ... (docs/wire.md, the reply)
--   LOST      '' or what this call found of a state the caller knew and Redis had lost
--             ('restored' from the caller's knowledge, or 'lost': it knew it closed)
--   ACK       this call's acknowledged notices, {token, workers that heard them} (notify), or nil
--   ISO       the calling reporter's isolation (until, ms), or nil: nothing in the reply
--             unless min_reporters > 1 and that reporter is isolated ("One sick host", reporters.lua)
local REPAIRED, EVENTS, LOST
local ACK
local ISO

-- ARGV 2 (format: docs/wire.md): the prefix's channel, the database, the sharded
-- channel, and the workers' channel (notify): on a cluster the breaker's sharded one, else the
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
    NOW_US = NOW * 1000
  else
    local time = redis.call('TIME')
    local us = time[2] + 0  -- (microseconds: digits, so Lua's coercion suffices, one strtod)
    local seconds = NUMS[time[1]] or num(time[1])
    NOW = seconds * 1000 + (us - us % 1000) / 1000
    NOW_US = seconds * 1000000 + us  -- the count window places batched successes by it (ring.lua)
  end
  REPAIRED, EVENTS, LOST, ISO, ACK = '', '', '', nil, nil
end

-- ARGV 6 (format: docs/wire.md; lua/_lib.lua's header): the caller's highest epoch (FLOOR) and what it knows
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
