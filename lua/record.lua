-- record.lua: the outcome of one admitted call; the only script a worker runs
-- per call while the breaker is closed.
--
-- KEYS  : state, window, leases, config, stats, events (see _lib.lua)
-- ARGV  : 1-4 common; 5 epoch the permit was issued under; 6 outcome
--         (success | failure | ignored); 7 duration ms; 8 lease ids ('' or
--         space-separated, from acquire.lua); 9 pending rejections;
--         10 pending would_reject; 11-26 config
-- Reads : state, config, window, leases.  Writes: stats (always), window
--         (closed), state (consecutive count, transitions), leases (released), events.
-- Returns the common reply (allowed is 1, reason is '' or 'stale').
local s, cfg = load_state(), load_config(11)
flush_pending(ARGV[9], ARGV[10])
local epoch, outcome, duration = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]) or 0
if outcome ~= 'success' and outcome ~= 'failure' then outcome = 'ignored' end

-- Release what the permit held. A probe lease found already expired means
-- the probe overran probe_timeout_seconds: it counts as a failed probe.
local probe, probe_expired = false, false
for id in string.gmatch(ARGV[8], '%S+') do
  local score = redis.call('ZSCORE', K_LEASES, id)
  if score then
    redis.call('ZREM', K_LEASES, id)
    if string.sub(id, 1, 2) == 'p:' then
      probe, probe_expired = true, tonumber(score) <= NOW
    end
  end
end

local failed = outcome == 'failure'
local slow = outcome ~= 'ignored' and cfg.slow_ms > 0 and duration >= cfg.slow_ms
stat('calls', 1)
stat(outcome == 'success' and 'successes' or failed and 'failures' or 'ignored', 1)
if slow then stat('slow', 1) end

if epoch ~= s.epoch then
  stat('stale', 1)          -- admitted before a transition: must not decide the new state
  return reply(s, 1, 'stale', '', cfg)
end
if outcome == 'ignored' then return reply(s, 1, '', '', cfg) end

if s.state == 'closed' then
  local w = window_add(cfg, failed, slow)
  local consec = failed and s.consec + 1 or 0
  if consec ~= s.consec then s.consec, s.dirty = consec, true end
  local cause = s.forced == '' and trip_cause(cfg, w, s.consec) or nil
  if cause then trip_open(s, cfg, cause, false) end
elseif s.state == 'half_open' and s.forced == '' then
  if reap_leases() > 0 or probe_expired then
    trip_open(s, cfg, 'probe_timeout', true)
  elseif probe and failed then
    trip_open(s, cfg, 'probe_failed', true)
  elseif probe then
    s.ho_ok, s.dirty = s.ho_ok + 1, true
    if s.ho_ok >= cfg.ho_successes then close(s, 'probes_succeeded') end
  end
  -- a result without a probe lease (observe mode) does not decide half_open
end
return reply(s, 1, '', '', cfg)
