-- ramp.lua: recovery that does not stampede (BreakerConfig.ramp_seconds, docs/recovery.md).
--
-- A close from a state that refused calls (probes succeeded; an operator's reset or
-- clear_force of a breaker open, half-open or forced open) stamps the state's ramp_until:
-- until then the calls admitted are a share rising linearly from ramp_from to 1. A worker
-- decides it from memory, or from the reply when it asked, by the reply's ramp_until,
-- ramp_ms and ramp_from, with its own credit (breaker_redis/engine/ramp.py); but a call
-- that asks acquire.lua for a bulkhead slot with the ramp undecided (no subscription, its
-- first call after the close) is decided here, with the breaker's credit (ramp_admits),
-- before the slot is taken. And a trip during the ramp opens with the backoff, as a
-- failed probe does.

-- ramp_until for a close now: NOW + ramp_ms, or 0 without a ramp (c nil: no config read).
local function ramp_end(c)
  local ms = c and c.ramp_ms or 0
  if ms > 0 then return NOW + ms end
  return 0
end

-- Whether the breaker is ramping up after a close (a trip now counts as a failed probe).
local function ramping(s, c)
  return s.ramp_until > NOW and (c.ramp_ms or 0) > 0
end

-- The share of calls admitted now (as breaker_redis/engine/ramp.py ramp_share; ramping).
local function ramp_share(s, c)
  local from = tonumber(c.ramp_from) or 0.1
  return math.max(from, 1 - (1 - from) * (s.ramp_until - NOW) / c.ramp_ms)
end

-- Whether the ramp admits a call acquire.lua decides (ramping): the breaker's credit, shared
-- by every call decided here (the workers asking for a slot together admit its share),
-- gains the share of the moment, and a whole credit (a million: integers, as ramp.py's)
-- admits the call and is spent. It is the state hash's ramp_credit, '<ramp_until>
-- <credit>': one of another ramp (an earlier close) counts as none.
local RAMP_UNIT = 1000000
local function ramp_admits(s, c)
  local till, kept = string.match(redis.call('HGET', K_STATE, 'ramp_credit') or '', '^(%d+) (%d+)$')
  local credit = tonumber(till) == s.ramp_until and tonumber(kept) or 0
  credit = credit + math.floor(ramp_share(s, c) * RAMP_UNIT + 0.5)
  local admitted = credit >= RAMP_UNIT
  if admitted then credit = credit - RAMP_UNIT end
  redis.call('HSET', K_STATE, 'ramp_credit', string.format('%d %d', s.ramp_until, credit))
  return admitted
end
