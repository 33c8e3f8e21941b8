-- record.lua: the outcomes of admitted calls; the only script a worker runs
-- for its calls while the breaker is closed.
--
-- A worker sends plain successes of calls it admitted while calm (see
-- update_armed in includes/rules.lua) in batches, a count per epoch, and every other
-- outcome one by one, each time together with the batch it holds, so Redis
-- sees one worker's results in the order they happened. A batch is judged as
-- a whole, and never resets the consecutive count: its successes happened
-- before the failure that armed the breaker, or while nothing could trip it.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common (5: config, 6: epoch floor); 7 on: `a` below:
--         the outcome, its duration and lease, the counts kept in memory, the batch, the
--         reporter (read only with min_reporters > 1: "One sick host", includes/reporters.lua),
--         the batched successes' end times (read only by a count window, includes/ring.lua)
-- Reads : state, config, window, leases.  Writes: stats (always), window
--         (closed), state (consecutive count, armed flag, transitions), leases (released), events.
-- Returns the common reply (allowed is 1, reason is '' or 'stale').
-- This script's own arguments, named once (breaker_redis/storage/args.py RecordArgs; docs/wire.md):
local a = {epoch = ARGV[7],  -- the epoch the permit was issued under
  outcome = ARGV[8],  -- success | failure | ignored, or '' for a batch alone
  duration_ms = ARGV[9],
  lease = ARGV[10],  -- '' or the lease ids acquire.lua handed out, space-separated
  rejected = ARGV[11], would_reject = ARGV[12], successes = ARGV[13],
  failures = ARGV[14], ignored = ARGV[15], slow = ARGV[16],  -- counted in memory
  batch_epoch = ARGV[17], batch = ARGV[18],  -- the batched successes: their epoch, how many
  reporter = ARGV[19],
  batch_times = ARGV[20]}  -- when the batched successes ended, for a count window ('': not sent)
local s = load_state(true)
local cfg = load_config()
flush_pending(a)
local epoch, outcome, duration = num(a.epoch), a.outcome, num(a.duration_ms) or 0
local batch_epoch, batch = num(a.batch_epoch), num(a.batch) or 0
local reporter, own  -- with min_reporters > 1 only
if cfg.min_rep then reporter, own = reporter_record(a.reporter, cfg) end

-- Counts outcomes of calls admitted while closed, trips when a rule holds, and
-- arms or calms the breaker. consec: the consecutive count after these outcomes;
-- batched: a batch of successes, which ends no run (the shared one or the reporter's).
local function closed_outcomes(calls, failures, slows, consec, lease, batched)
  local w = window_record(cfg, calls, failures, slows, batched and a.batch_times or nil)
  if consec ~= s.consec then s.consec, s.dirty = consec, true end
  local cause = s.forced == '' and trip_cause(cfg, w, s.consec) or nil
  if cause and group_holds_back(s, cfg) then cause = nil end  -- a group member without its grant
  if reporter and s.forced == '' then
    cause = quorum(s, cfg, cause, calls, failures, reporter, lease or '', batched)
  end
  if cause then trip_open(s, cfg, cause, ramping(s, cfg)) else update_armed(s, cfg, w) end
end

if batch > 0 then
  stat('successes', batch)
  if not current_epoch(s, batch_epoch) then
    stat('stale', batch)
  elseif s.state == 'closed' then
    closed_outcomes(batch, 0, 0, s.consec, nil, true)  -- batched successes are never slow
  end
end
if outcome == '' then return reply(s, 1, '', '', cfg) end
if outcome ~= 'success' and outcome ~= 'failure' then outcome = 'ignored' end

-- Release what the permit held. A probe lease found already expired means
-- the probe overran probe_timeout_seconds: it counts as a failed probe.
local probe, probe_expired = false, false
if a.lease ~= '' then  -- most calls hold no lease
  for id in string.gmatch(a.lease, '%S+') do
    local score = redis.call('ZSCORE', K_LEASES, id)
    if score then
      redis.call('ZREM', K_LEASES, id)
      if string.sub(id, 1, 2) == 'p:' then
        probe, probe_expired = true, tonumber(score) <= NOW
      end
    end
  end
end

local failed = outcome == 'failure'
local slow = outcome ~= 'ignored' and cfg.slow_ms > 0 and duration >= cfg.slow_ms
stat(outcome == 'success' and 'successes' or failed and 'failures' or 'ignored', 1)
if slow then stat('slow', 1) end

if not current_epoch(s, epoch) then
  stat('stale', 1)          -- admitted before a transition: must not decide the new state
  return reply(s, 1, 'stale', '', cfg)
end
-- a probe that overran its lease (this one or another) failed, whatever came back late
if s.state == 'half_open' and s.forced == '' and (reap_leases() > 0 or probe_expired) then
  trip_open(s, cfg, 'probe_timeout', true)
  return reply(s, 1, '', '', cfg)
end
if outcome == 'ignored' then
  if reporter and a.lease ~= '' then reporter_probe_ignored(cfg, reporter, own, a.lease) end
  return reply(s, 1, '', '', cfg)
end

if s.state == 'closed' then
  closed_outcomes(1, failed and 1 or 0, slow and 1 or 0, failed and s.consec + 1 or 0, a.lease)
elseif s.state == 'half_open' and s.forced == '' then
  if probe and failed then
    trip_open(s, cfg, 'probe_failed', true)
  elseif probe then
    s.ho_ok, s.dirty = s.ho_ok + 1, true
    if s.ho_ok >= cfg.ho_successes then close(s, 'probes_succeeded', cfg) end
  end
  -- a result without a probe lease (observe mode) does not decide half_open
end
return reply(s, 1, '', '', cfg)
