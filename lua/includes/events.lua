-- events.lua: a transition: the state's change, its line in the events list, its message.
--
local EVENTS_KEPT = 10  -- what `breaker-redis show` prints (breaker_redis/ops/reader.py EVENTS_KEPT)

-- The events list's lines: docs/wire.md, "The events list" (written by transition).

-- The newest line of the events list (see transition), as a state to restore
-- from; nil if there is none or it does not parse.
local function last_transition()
  local line = redis.call('LINDEX', K_EVENTS, 0)
  if type(line) ~= 'string' then return nil end
  local to, epoch, open_until, forced = string.match(line, '^%d+ [a-z_]+ ([a-z_]+) [a-z_]+ (%d+) (%d+) ([a-z-]+)$')
  if not to then return nil end
  return {state = to, epoch = tonumber(epoch), born = -1, open_until = tonumber(open_until),
    forced = forced == '-' and '' or forced, source = 'events'}
end

local function transition(s, to, cause)
  local from = s.state
  s.state, s.epoch, s.armed, s.dirty = to, s.epoch + 1, false, true
  local line = string.format('%d %s %s %s %d %d %s', NOW, from, to, cause, s.epoch, s.open_until,
    s.forced ~= '' and s.forced or '-')
  local pushed = redis.pcall('LPUSH', K_EVENTS, line)
  if type(pushed) == 'table' and pushed.err then
    if not string.find(tostring(pushed.err), 'WRONGTYPE', 1, true) then error(pushed) end
    redis.call('DEL', K_EVENTS)  -- another type, written there by hand
    repaired('events')
    redis.call('LPUSH', K_EVENTS, line)
  end
  redis.call('LTRIM', K_EVENTS, 0, EVENTS_KEPT - 1)
  publish(s, 'transition', {from = from, to = to, open_until = s.open_until, forced = s.forced, cause = cause})
  EVENTS = EVENTS .. (EVENTS == '' and '' or ',') .. from .. '>' .. to .. ':' .. cause
end
