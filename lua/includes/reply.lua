-- reply.lua: the reply every state-changing script gives (reply, ack_field).
--
-- The ack field: '<token> <workers>' of this call's notices (notify), '' for none.
local function ack_field()
  return ACK and string.format('%s %d', ACK[1], ACK[2]) or ''
end

-- The reply every state-changing script gives, so a worker refreshes what it knows. Its
-- fields, in this order, are described once, in docs/wire.md ("The common reply"), and
-- decoded by Reply.decode (breaker_redis/engine/knowledge.py): a field is only ever added
-- at the end, which a worker of the previous release leaves unread.
local function reply(s, allowed, reason, lease, c)
  save_state(s)
  return {allowed, reason, s.state, s.epoch, s.open_until, s.forced, lease, NOW,
    c and c.mode or '', c and c.max_conc or 0, EVENTS, c and c.slow_ms or 0, s.armed and 1 or 0, s.arms,
    s.born, REPAIRED, LOST, ISO or 0, ack_field(), s.ramp_until, c and c.ramp_ms or 0,
    c and c.ramp_from and tostring(c.ramp_from) or '', c and c.win_n or 0}
end
