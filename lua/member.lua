-- member.lua: a group member's grant, in the member's own slot (see group_holds_back
-- in _lib.lua and group.lua). Grants are tokens the group hands out in increasing
-- order; 'revoked' keeps the highest one taken back, so a grant that arrives after
-- it was revoked (its worker was slow between the two steps) is refused, and a
-- revoked member can open again only with a newer grant.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common (5: the member's config, naming its group); 7 op; 8 token:
--   grant   keep grant <token> unless it was revoked, then trip the breaker now if it
--           is closed, not forced, and a trip rule holds (the trip it had held back)
--   revoke  take the grant back (<token>, or '' for the one it holds) if the breaker
--           is closed: it no longer needs it. An open or half-open member keeps it.
-- Reads : state (grant, revoked), config, window.  Writes: state, and what a trip writes.
-- Returns the common reply: grant: allowed 1, or 0 with reason 'revoked'; revoke:
--         allowed 1 with lease = the token taken back ('' for none), or 0 with
--         reason 'open' (kept).
local s = load_state(true)
local cfg = load_config()
local op, token = ARGV[7], tonumber(ARGV[8])
local v = redis.call('HMGET', K_STATE, 'grant', 'revoked')
local held, revoked = tonumber(v[1]), tonumber(v[2]) or 0

if op == 'grant' then
  if not token or token <= revoked then return reply(s, 0, 'revoked', '', cfg) end
  if held ~= token then redis.call('HSET', K_STATE, 'grant', token) end
  if s.state == 'closed' and s.forced == '' then
    local cause = trip_cause(cfg, window_read(cfg, false), s.consec)
    if cause then trip_open(s, cfg, cause, false) end
  end
  return reply(s, 1, '', '', cfg)
elseif op == 'revoke' then
  if s.state ~= 'closed' then return reply(s, 0, 'open', '', cfg) end
  local taking = token or held
  if not taking then return reply(s, 1, '', '', cfg) end
  if taking > revoked then redis.call('HSET', K_STATE, 'revoked', taking) end
  if held and held <= taking then redis.call('HDEL', K_STATE, 'grant') end
  return reply(s, 1, '', tostring(taking), cfg)
end
return redis.error_reply('unknown member op ' .. tostring(op))
