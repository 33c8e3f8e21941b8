-- ramp.lua: recovery that does not stampede (BreakerConfig.ramp_seconds, docs/recovery.md).
--
-- A close from a state that refused calls (probes succeeded; an operator's reset or
-- clear_force of a breaker open, half-open or forced open) stamps the state's ramp_until:
-- until then every worker admits a share of its calls rising linearly from ramp_from to 1,
-- deciding from memory by the reply's ramp_until, ramp_ms and ramp_from
-- (breaker_redis/engine/knowledge.py Knowledge.ramp_share); the scripts decide nothing
-- else of it but this: a trip during the ramp opens with the backoff, as a failed probe does.

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
