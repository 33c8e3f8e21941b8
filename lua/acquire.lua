-- acquire.lua: may this call go ahead? Run when a worker cannot decide from
-- what it already knows: first use, open period elapsed, half_open, bulkhead,
-- or knowledge too old.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common (5: config, 6: epoch floor); 7 on: `a` below
-- Reads : state (with its armed flag, which the reply carries), config, leases.  Writes: state (transitions, lease seq),
--         leases (probe or bulkhead lease), stats (rejected, would_reject), events.
-- Returns the common reply; allowed is 1 (go), 2 (observe mode: would have been
--         denied, go anyway) or 0 (denied, reason open | half_open_full |
--         forced_open | bulkhead | isolated | ramp); lease is the id to hand back to record.lua.
-- With a bulkhead, the ramp after a close (includes/ramp.lua) is decided here, before the
-- slot, unless the worker decided it from memory (a.ramped): a call it leaves out holds none.
-- (Without one, the worker decides it from the reply: breaker_redis/engine/core.py _from_reply.)
-- This script's own arguments, named once (breaker_redis/storage/args.py AcquireArgs; docs/wire.md):
local a = {rejected = ARGV[7], would_reject = ARGV[8], successes = ARGV[9],
  failures = ARGV[10], ignored = ARGV[11], slow = ARGV[12],
  reporter = ARGV[13],  -- read only with min_reporters > 1 ("One sick host", includes/reporters.lua)
  ramped = ARGV[14]}  -- '1': the worker decided the ramp from memory; else, with a bulkhead, here
local s = load_state(true)
local cfg = load_config()
flush_pending(a)

local allowed, reason, lease = 0, '', ''
if s.forced == 'open' then
  reason = 'forced_open'
elseif s.forced == 'closed' then
  allowed = 1
else
  if s.state == 'open' and NOW >= s.open_until then
    s.ho_ok = 0
    transition(s, 'half_open', 'open_elapsed')
  end
  if s.state == 'half_open' then
    if reap_leases() > 0 then
      trip_open(s, cfg, 'probe_timeout', true)   -- a probe died or hung: it failed
    elseif #probe_ids() < cfg.ho_max then
      lease, allowed = take_lease(s, 'p', cfg.probe_ms), 1
    else
      reason = 'half_open_full'
    end
  end
  if s.state == 'open' then reason = 'open' elseif s.state == 'closed' then allowed = 1 end
  local reporter, own  -- with min_reporters > 1, closed: the caller's reporter and its record
  if allowed == 1 and s.state == 'closed' and cfg.min_rep then  -- is the caller's reporter isolated?
    reporter, own = reporter_record(a.reporter, cfg)
    allowed, reason, lease = reporter_admits(s, cfg, reporter, own)
  end

  -- the ramp after a close, before a bulkhead slot, unless the worker decided it from memory
  -- (not for an isolated reporter's probe)
  if allowed == 1 and cfg.max_conc > 0 and lease == '' and s.state == 'closed' and a.ramped ~= '1'
    and ramping(s, cfg) and not ramp_admits(s, cfg) then
    allowed, reason = 0, 'ramp'
  end

  if allowed == 1 and cfg.max_conc > 0 then      -- distributed bulkhead
    if s.state ~= 'half_open' then reap_leases() end   -- half_open reaped above
    local probes = s.state == 'half_open' and #probe_ids() or 0
    if redis.call('ZCARD', K_LEASES) - probes >= cfg.max_conc then
      if lease == '' then  -- nothing taken
      elseif string.sub(lease, 1, 2) == 'i:' then  -- an isolated reporter's probe, in its record:
        reporter_probe_ignored(cfg, reporter, own, lease)  -- given back, not left to time out
      else
        redis.call('ZREM', K_LEASES, lease)  -- a half-open probe
      end
      allowed, reason, lease = 0, 'bulkhead', ''
    else
      local slot = take_lease(s, 'b', cfg.probe_ms)
      lease = lease ~= '' and (lease .. ' ' .. slot) or slot
    end
  end
end

if allowed == 0 then
  if cfg.mode == 'observe' and reason ~= 'forced_open' then
    allowed = 2
    stat('would_reject', 1)
  else
    stat('rejected', 1)
  end
end
return reply(s, allowed, reason, lease, cfg)
