-- state.lua: the state hash: load_state reads (and repairs) it, save_state writes what changed.
--
-- A numeric field x (false when missing) that is there but not a finite
-- number, n being tonumber(x): the hash was edited. Beyond 2^53 no worker
-- wrote it (and inf, nan are no numbers).
local function unparsable(x, n)
  return x and (n == nil or n ~= n or n > 9007199254740991 or n < -9007199254740991)
end

-- The state hash's fields, read in this order by load_state, written by save_state.
local STATE_FIELDS = {'state', 'epoch', 'open_until', 'forced', 'consec', 'open_ms', 'ho_ok', 'seq',
  'ttl_at', 'born', 'armed', 'arms', 'lost', 'held', 'ramp_until'}

-- State: a missing or corrupted hash reads as a fresh closed breaker whose
-- epoch starts above every epoch handed out before (see ARGV 6 in _lib.lua), so a worker
-- never mistakes the new breaker's results for old ones or the reverse.
-- restore: acquire and record restore a lost state the caller knows (restore_lost).
local function load_state(restore)
  local v = redis.call('HMGET', K_STATE, unpack(STATE_FIELDS))
  local N = NUMS  -- N[x] or num(x): a value the memo has costs no call
  local epoch, open_until, consec = N[v[2]] or num(v[2]), N[v[3]] or num(v[3]), N[v[5]] or num(v[5])
  local open_ms, ho_ok, seq = N[v[6]] or num(v[6]), N[v[7]] or num(v[7]), N[v[8]] or num(v[8])
  local ttl_at, born, arms = N[v[9]] or num(v[9]), N[v[10]] or num(v[10]), N[v[12]] or num(v[12])
  local lost, held, ramp_until = N[v[13]] or num(v[13]), N[v[14]] or num(v[14]), N[v[15]] or num(v[15])
  local s = {state = v[1], epoch = epoch or 0, open_until = open_until or 0,
    forced = v[4] or '', consec = consec or 0, open_ms = open_ms or 0,
    ho_ok = ho_ok or 0, seq = seq or 0, ttl_at = ttl_at or 0,
    born = born or 0, armed = v[11] == '1', arms = arms or 0, lost = lost or 0,
    held = held or 0, ramp_until = ramp_until or 0, dirty = false, was = v}
  -- a numeric field that is there but not a finite number: the hash was edited; start afresh
  -- (the common case, every one of them there and in range, decided without a call)
  local M = 9007199254740991
  local corrupted = false
  if not (epoch and open_until and consec and open_ms and ho_ok and seq and born and arms
    and epoch <= M and epoch >= -M and open_until <= M and open_until >= -M and consec <= M and consec >= -M
    and open_ms <= M and open_ms >= -M and ho_ok <= M and ho_ok >= -M and seq <= M and seq >= -M
    and born <= M and born >= -M and arms <= M and arms >= -M) then
    corrupted = unparsable(v[2], epoch) or unparsable(v[3], open_until) or unparsable(v[5], consec)
      or unparsable(v[6], open_ms) or unparsable(v[7], ho_ok) or unparsable(v[8], seq) or unparsable(v[10], born)
      or unparsable(v[12], arms)
  end
  if corrupted or (v[1] and v[1] ~= 'closed' and v[1] ~= 'open' and v[1] ~= 'half_open') then
    repaired('state')
  end
  local created = corrupted or (s.state ~= 'closed' and s.state ~= 'open' and s.state ~= 'half_open')
  if created then
    if unparsable(v[2], epoch) then s.epoch = 0 end
    caller_knows()
    s.epoch = math.max(NOW, FLOOR + 1, s.epoch + 1)
    s.state, s.born, s.armed, s.dirty = 'closed', s.epoch, false, true
    s.open_until, s.consec, s.open_ms, s.ho_ok, s.seq, s.arms, s.forced = 0, 0, 0, 0, 0, 0, ''
    s.ramp_until = 0
    s.lost = v[1] and s.born or 0  -- a repair is logged as one (REPAIRED), not counted as a loss
    s.was = nil  -- written whole
  end
  -- was (the HMGET reply itself: one table fewer per call): the fields as stored, for
  -- save_state to compare, the numbers parsed (nil: missing) and the armed flag as a
  -- boolean (anything but '1' or '0' stays a string, never equal: it is rewritten)
  v[2], v[3], v[5], v[6], v[7], v[8], v[9], v[10], v[12], v[13], v[14], v[15] =
    epoch, open_until, consec, open_ms, ho_ok, seq, ttl_at, born, arms, lost, held, ramp_until
  if v[11] == '1' then v[11] = true elseif v[11] == '0' then v[11] = false end
  if s.forced ~= 'open' and s.forced ~= 'closed' then s.forced = '' end
  if restore and not restore_lost(s, created) and created then mark_created(s) end
  return s
end

-- Whether a result admitted under `epoch` belongs to the current state: the
-- same epoch, or one from before the hash was created anew while nothing has
-- happened since (its keys vanished; the fresh breaker made no transition).
local function current_epoch(s, epoch)
  return epoch == s.epoch or (epoch ~= nil and epoch < s.born and s.epoch == s.born)
end

-- Writes the fields of the state that changed (a failure that only counts one more
-- in a run writes `consec` alone), and stamps the keys' use once a minute (ttl_at,
-- for sweep.lua), dropping any TTL an older version gave them. The whole hash, the
-- writer's key TTL (ttl) and the config copy (cfg) are written when the hash is
-- created, at the stamp and at a transition.
local function save_state(s)
  local stamp = NOW - s.ttl_at >= TTL_REFRESH_MS or NOW < s.ttl_at
  if stamp then
    s.ttl_at, s.dirty = NOW, true
    for i = 1, 6 do redis.call('PERSIST', KEY_LIST[i]) end  -- cfg: rewritten below
  end
  if not s.dirty then return end
  local whole = stamp or s.was == nil or EVENTS ~= ''
  local was, f, n = s.was or {}, SCRATCH, 0
  for i = 1, #STATE_FIELDS do  -- (not ipairs: a C call per field)
    local value = s[STATE_FIELDS[i]]
    if whole or was[i] ~= value then
      if value == true then value = '1' elseif value == false then value = '0' end  -- armed
      f[n + 1], f[n + 2], n = STATE_FIELDS[i], value, n + 2
    end
  end
  if whole then f[n + 1], f[n + 2], n = 'ttl', TTL, n + 2 end
  if n > 0 then redis.call('HSET', K_STATE, unpack(f, 1, n)) end
  -- the caller's config, for readers that have none (the CLI's `show`): at least once a
  -- minute while a worker runs. A key of its own: in the state hash, a value this long
  -- would make Redis store the hash less compactly
  if whole and ARGS[5] ~= '' then redis.call('SET', K_CFG, ARGS[5]) end
end
