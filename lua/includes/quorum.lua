-- quorum.lua: the quorum of reporters before a shared trip, over the whole reporters hash.
--
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
