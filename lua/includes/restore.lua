-- restore.lua: a state Redis lost, restored from what the caller knew or the events list.
--
-- A state Redis lost: its keys were evicted (an evicting maxmemory-policy),
-- flushed or deleted, and created anew, here (created) or by a worker that
-- knew nothing (then nothing has happened to the new one since: epoch ==
-- born). What it was comes from the caller's knowledge (KNOWN), or, when the
-- hash is created here, from the breaker's last transition (the events list,
-- another key, which may well have survived) when that is newer (a higher
-- epoch: the caller may not have heard of the last transition). A new
-- incarnation that restores nothing leaves a line in the history (see
-- mark_created), so an older line is never taken for its state later.
-- An open, half-open or forced state is restored (a transition, cause
-- 'restored', so every worker hears of it): an open breaker stays open until
-- the open_until it had, for a worker that starts now too. A caller that
-- knew it closed can restore nothing (the window's counts are gone). A loss
-- is counted once per new incarnation (stats state_lost) and the reply says
-- so, for the worker to log it.
-- What a caller only heard of (ARGV 6 ' heard': a transition message naming this
-- database, about a later incarnation than the one Redis last replied to it
-- about) is restored only over an incarnation created after the one the message
-- is about. So the incarnation has changed since the caller's last reply: the
-- keys were lost. A message (forged, say) about a later incarnation than the
-- current one restores nothing, and one about an earlier incarnation than the
-- caller's last reply is not offered (knowledge.Memory.floor_arg).
local function restore_lost(s, created)  -- true when it restored a state
  -- the common case, decided on the state alone: a breaker that made a transition since
  -- its hash was created, is not closed, or is held by an operator restores nothing
  if s.epoch ~= s.born or s.state ~= 'closed' or s.forced ~= '' or s.held == s.born then return false end
  caller_knows()
  local was = KNOWN
  if created then
    local line = last_transition()
    if line and (was == nil or line.epoch > was.epoch) then was = line end
  end
  if was == nil or s.epoch ~= s.born or was.born == s.born or s.state ~= 'closed' or s.forced ~= ''
    or s.held == s.born  -- an operator has acted on this incarnation: theirs is the last word
    or (was.heard and was.born > s.born) then
    return false
  end
  local repair = s.lost == s.born  -- created by a repair (logged as one), not counted as a loss
  local restorable = was.state ~= 'closed' or was.forced ~= ''
  if not repair and (restorable or was.source == nil) then
    s.lost, s.dirty = s.born, true
    stat('state_lost', 1)
  end
  if not restorable then
    if not repair and was.source == nil then LOST = 'lost' end
    return false
  end
  if not repair then LOST = was.source == 'events' and 'restored_events' or 'restored' end
  local to = was.state
  if was.forced ~= '' then to = was.forced end
  s.forced, s.consec, s.ho_ok = was.forced, 0, 0
  s.open_until = (to == 'open' and was.forced == '') and was.open_until or 0
  if to == 'half_open' then drop_probes() end  -- an earlier incarnation's: their results are stale
  -- above every epoch the caller saw (a worker that knew nothing may have created the
  -- new hash from a lower floor), so epochs never go backwards for anyone
  s.epoch = math.max(s.epoch, FLOOR, was.epoch)
  transition(s, to, 'restored')
  return true
end

-- A new incarnation that restored nothing: a line in the history, when there is
-- one, so its last line no longer says what a lost incarnation was (no
-- transition: nothing changed for any worker, and no epoch is spent).
-- (its line: docs/wire.md, "The events list")
local function mark_created(s)
  if redis.call('EXISTS', K_EVENTS) == 0 then return end
  redis.call('LPUSH', K_EVENTS, string.format('%d lost closed created %d 0 -', NOW, s.epoch))
  redis.call('LTRIM', K_EVENTS, 0, EVENTS_KEPT - 1)
end
