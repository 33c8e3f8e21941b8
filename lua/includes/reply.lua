-- reply.lua: the reply every state-changing script gives (reply, ack_field).
--
-- The reply every state-changing script gives, so a worker refreshes what it knows
-- (each field: docs/wire.md, "The common reply"; decoded by Reply.decode):
-- {allowed, reason, state, epoch, open_until, forced, lease, now, mode, max_conc, events, slow_ms,
--  armed (0/1), arms, born, repaired (the corrupted keys this call repaired, comma-separated),
-- '<token> <workers>' of this call's notices (notify), '' for none: the reply's last field.
local function ack_field()
  return ACK and string.format('%s %d', ACK[1], ACK[2]) or ''
end

--  lost ('', 'restored' or 'lost': see restore_lost), until when the calling reporter is
--  isolated (min_reporters > 1; 0 when it is not), ack ('<token> <workers>' when this call
--  published a notice: see notify; '' when not)}
local function reply(s, allowed, reason, lease, c)
  save_state(s)
  return {allowed, reason, s.state, s.epoch, s.open_until, s.forced, lease, NOW,
    c and c.mode or '', c and c.max_conc or 0, EVENTS, c and c.slow_ms or 0, s.armed and 1 or 0, s.arms,
    s.born, REPAIRED, LOST, ISO or 0, ack_field()}
end
