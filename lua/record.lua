-- record.lua: the outcomes of admitted calls; the only script a worker runs
-- for its calls while the breaker is closed.
--
-- A worker sends plain successes of calls it admitted while closed in
-- batches (a count per epoch), and every other outcome one by one, each
-- time together with the batch it holds, so Redis sees one worker's results
-- in the order they happened.
--
-- KEYS  : state, window, leases, config, stats, events (see _lib.lua)
-- ARGV  : 1-5 common (5: config); 6 epoch the permit was issued under;
--         7 outcome (success | failure | ignored, or '' for a batch alone);
--         8 duration ms; 9 lease ids ('' or space-separated, from acquire.lua);
--         10 pending rejections; 11 pending would_reject;
--         12 epoch of the batched successes; 13 how many
-- Reads : state, config, window, leases.  Writes: stats (always), window
--         (closed), state (consecutive count, transitions), leases (released), events.
-- Returns the common reply (allowed is 1, reason is '' or 'stale').
local s = load_state()
local cfg = load_config(s)
flush_pending(ARGV[10], ARGV[11])
local epoch, outcome, duration = tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8]) or 0
local batch_epoch, batch = tonumber(ARGV[12]), tonumber(ARGV[13]) or 0

-- Counts outcomes of calls admitted while closed, and trips when a rule holds.
local function closed_outcomes(calls, failures, slows, failed_last)
  local w = window_add(cfg, calls, failures, slows)
  local consec = failed_last and s.consec + 1 or 0
  if consec ~= s.consec then s.consec, s.dirty = consec, true end
  local cause = s.forced == '' and trip_cause(cfg, w, s.consec) or nil
  if cause then trip_open(s, cfg, cause, false) end
end

if batch > 0 then
  stat('successes', batch)
  if batch_epoch ~= s.epoch then
    stat('stale', batch)
  elseif s.state == 'closed' then
    -- Successes (batched ones are never slow) can trip only by bringing the
    -- window to minimum_calls; those after that point arrived after the trip.
    local w = window_read(cfg)
    local first = batch
    if w.tc < cfg.min_calls and w.tc + batch > cfg.min_calls then first = cfg.min_calls - w.tc end
    closed_outcomes(first, 0, 0, false)
    if s.state ~= 'closed' then
      stat('stale', batch - first)
    elseif first < batch then
      closed_outcomes(batch - first, 0, 0, false)
    end
  end
end
if outcome == '' then return reply(s, 1, '', '', cfg) end
if outcome ~= 'success' and outcome ~= 'failure' then outcome = 'ignored' end

-- Release what the permit held. A probe lease found already expired means
-- the probe overran probe_timeout_seconds: it counts as a failed probe.
local probe, probe_expired = false, false
for id in string.gmatch(ARGV[9], '%S+') do
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
stat(outcome == 'success' and 'successes' or failed and 'failures' or 'ignored', 1)
if slow then stat('slow', 1) end

if epoch ~= s.epoch then
  stat('stale', 1)          -- admitted before a transition: must not decide the new state
  return reply(s, 1, 'stale', '', cfg)
end
-- a probe that overran its lease (this one or another) failed, whatever came back late
if s.state == 'half_open' and s.forced == '' and (reap_leases() > 0 or probe_expired) then
  trip_open(s, cfg, 'probe_timeout', true)
  return reply(s, 1, '', '', cfg)
end
if outcome == 'ignored' then return reply(s, 1, '', '', cfg) end

if s.state == 'closed' then
  closed_outcomes(1, failed and 1 or 0, slow and 1 or 0, failed)
elseif s.state == 'half_open' and s.forced == '' then
  if probe and failed then
    trip_open(s, cfg, 'probe_failed', true)
  elseif probe then
    s.ho_ok, s.dirty = s.ho_ok + 1, true
    if s.ho_ok >= cfg.ho_successes then close(s, 'probes_succeeded') end
  end
  -- a result without a probe lease (observe mode) does not decide half_open
end
return reply(s, 1, '', '', cfg)
