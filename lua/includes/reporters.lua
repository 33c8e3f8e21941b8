-- reporters.lua: one reporter's record in the reporters hash: parse, write, isolate, admit.
--
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
--     (at most REP_CAP: quorum.lua). The key expires a window after the last
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
-- (the record's format: docs/wire.md, "Hash records")
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
