-- admin.lua: an operator's word on a breaker; it always wins over the rules.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common (5: the caller's config for trip, else ''); 7 op:
--   force_open   deny every call until cleared (state open, retry_after unknown)
--   force_closed admit every call, keep counting, never trip until cleared
--   clear_force  back to automatic, closed with a clean window (no-op if not forced)
--   (reset and clear_force of a breaker that refused calls start the ramp: includes/ramp.lua)
--   trip         open now for open_seconds (no backoff), then half_open as after any
--                trip; clears a force (pybreaker's open())
--   half_open    half_open now: the next acquire takes a probe lease; clears a force
--   reset        closed, clean window, backoff and leases dropped, force cleared;
--                cumulative stats are kept (they are counters, e.g. for Prometheus),
--                but one that does not parse is zeroed: a reset repairs every key
-- Every op that leaves the breaker closed (force_closed, clear_force, reset) gives a group
-- member's grant back (give_back_grant in includes/grants.lua; the reply's events say 'released:<token>').
-- Reads : state.  Writes: state, window, leases, events, reporters (dropped); publishes the change.
-- Returns the common reply (allowed 1, reason '' or 'unchanged').
-- This script's own arguments, named once (breaker_redis/storage/args.py AdminArgs; docs/wire.md):
local a = {op = ARGV[7]}
local op = a.op
local s = load_state()
-- an operator's word on this incarnation of the keys: no worker restores an older state
-- over it (restore_lost), also where it changed nothing (auto on a state just lost)
if s.held ~= s.born then s.held, s.dirty = s.born, true end
redis.call('DEL', rep_key())  -- and every reporter's isolation ends (min_reporters > 1)

-- The config the ramp after a close reads (includes/ramp.lua): an operator's call carries
-- none, so the one of the workers' last call (the cfg key) with the live overrides; nil if none.
local function workers_config()
  local stored = redis.call('GET', K_CFG)
  if not stored then return nil end
  ARGS[5] = stored  -- where load_config reads it
  local ok, c = pcall(load_config)
  return ok and c or nil
end

-- Closed, clean. Closing a breaker that refused calls (open, half-open, forced open) starts
-- the ramp, as probes that succeeded do: the stampede would be the same; a closed one's
-- ramp runs on, a forced closed one admitted everything and has none.
local function clean(forced, cause)
  if s.state ~= 'closed' or s.forced == 'open' then
    s.ramp_until = ramp_end(workers_config())
  elseif s.forced == 'closed' then
    s.ramp_until = 0
  end
  s.forced, s.consec, s.open_ms, s.ho_ok, s.open_until = forced, 0, 0, 0, 0
  redis.call('DEL', K_WINDOW, K_LEASES)
  give_back_grant(nil)  -- a group member's grant: closed, it needs none (_lib.lua)
  transition(s, 'closed', cause)
end

if op == 'force_open' then
  s.forced, s.open_until, s.ho_ok = 'open', 0, 0
  redis.call('DEL', K_LEASES)
  transition(s, 'open', 'forced_open')
elseif op == 'force_closed' then
  s.forced, s.open_until, s.ho_ok, s.ramp_until = 'closed', 0, 0, 0  -- admits everything: no ramp
  drop_probes()
  give_back_grant(nil)  -- forced closed, it never trips: a group member needs no grant
  transition(s, 'closed', 'forced_closed')
elseif op == 'clear_force' then
  if s.forced == '' then return reply(s, 1, 'unchanged', '', nil) end
  clean('', 'force_cleared')
elseif op == 'trip' then
  local cfg = load_config()
  s.forced, s.consec, s.ho_ok = '', 0, 0
  s.open_ms, s.open_until = cfg.open_ms, NOW + cfg.open_ms
  drop_probes()
  transition(s, 'open', 'opened')
elseif op == 'half_open' then
  s.forced, s.consec, s.ho_ok, s.open_until = '', 0, 0, 0
  drop_probes()
  transition(s, 'half_open', 'half_opened')
elseif op == 'reset' then
  -- a counter edited into something that does not parse starts again from 0
  local counters = redis.call('HGETALL', K_STATS)
  for i = 1, #counters, 2 do
    if not string.find(counters[i + 1], '^%-?%d+$') then
      redis.call('HSET', K_STATS, counters[i], 0)
      repaired('stats')
    end
  end
  clean('', 'reset')
else
  return redis.error_reply('unknown admin op ' .. tostring(op))
end
return reply(s, 1, '', '', nil)
