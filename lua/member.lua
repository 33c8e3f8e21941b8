-- member.lua: a group member's grant, in the member's own slot (see group_holds_back
-- in _lib.lua and group.lua). Grants are tokens the group hands out in increasing
-- order; 'revoked' keeps the highest one taken back, so a grant that arrives after
-- it was revoked (its worker was slow between the two steps) is refused, and a
-- revoked member can open again only with a newer grant. A grant is kept only for the
-- trip it was asked for, and given back when the member closes (give_back_grant in
-- _lib.lua): a closed member holds none, so a grant never outlives the open state it
-- was granted for.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common (5: the member's config, naming its group; '' for revoke and release,
--         which read none); 7 op; 8 token; 9 cause (release):
--   grant   keep grant <token> unless it was revoked, and trip the breaker now if it is
--           closed, not forced, and a trip rule holds (the trip it had held back); when no
--           rule holds (or it is forced) the grant is not needed: revoked at once. An open or
--           half-open member keeps the grant it holds, or takes this one.
--   revoke  take the grant back (up to <token>, or '' for the one it holds) if the breaker
--           is closed or forced (a force needs no grant), or open and idle: its open period
--           ended IDLE_MS ago and no call has probed it since (no worker calls it any more:
--           it is closed first, cause 'idle'). An open member in use keeps it.
--   release take the grant back (up to <token>) whatever the state: an open or half-open
--           member is closed first (transition cause ARGV 9: 'released', by hand, or
--           'not_listed', no longer listed by the group's newest config).
-- Reads : state (grant, revoked), config (grant), window (grant), leases and events (revoke,
--         half-open).  Writes: state, and what a trip or a close writes.
-- Returns the common reply: grant: allowed 1, or 0 with reason 'revoked' (a token taken back
--         earlier) or 'unneeded', and lease = the highest token revoked, which the group may
--         forget; revoke, release: allowed 1 with lease = the highest token revoked ('0' when
--         none ever was), or 0 with reason 'open' (kept).
local s = load_state(true)
-- This script's own arguments, named once (breaker_redis/storage/args.py MemberArgs; docs/wire.md):
local a = {op = ARGV[7], token = ARGV[8], cause = ARGV[9]}
local op, token = a.op, token_of(a.token)
local IDLE_MS = 60000

-- Open, and no call for IDLE_MS after one could have probed it: nobody calls it any more.
local function idle()
  if s.forced ~= '' then return false end
  if s.state == 'open' then return NOW >= s.open_until + IDLE_MS end
  -- half_open: since the open period ended, the transition to it, and the last lease's expiry
  local since = s.open_until
  local line = redis.call('LINDEX', K_EVENTS, 0)
  local at = type(line) == 'string' and tonumber(string.match(line, '^(%d+) ')) or nil
  if at and at <= MAX_TOKEN then since = math.max(since, at) end
  local last = redis.call('ZRANGE', K_LEASES, -1, -1, 'WITHSCORES')
  local expiry = last[2] and tonumber(last[2]) or nil
  if expiry and expiry == expiry and expiry < math.huge then since = math.max(since, expiry) end
  return NOW >= since + IDLE_MS
end

if op == 'grant' then
  local cfg = load_config()
  local held, revoked = grant_fields()
  if not token or token <= revoked then
    return reply(s, 0, 'revoked', string.format('%d', revoked), cfg)
  end
  if s.state ~= 'closed' then  -- open or half-open (a probe that failed reopened it): keeps one
    if not held then redis.call('HSET', K_STATE, 'grant', token) end
    return reply(s, 1, '', '', cfg)
  end
  local cause = s.forced == '' and trip_cause(cfg, window_now(cfg), s.consec) or nil
  if not cause then  -- nothing to trip any more (a success came first), or forced: not kept
    return reply(s, 0, 'unneeded', string.format('%d', give_back_grant(token)), cfg)
  end
  if held and held ~= token then redis.call('HSET', K_STATE, 'revoked', math.max(revoked, held)) end
  redis.call('HSET', K_STATE, 'grant', token)
  trip_open(s, cfg, cause, ramping(s, cfg))
  return reply(s, 1, '', '', cfg)
elseif op == 'revoke' or op == 'release' then
  if s.state ~= 'closed' and s.forced == '' then
    if op == 'release' then
      local cause = a.cause
      if cause ~= 'released' and cause ~= 'not_listed' then
        return redis.error_reply('unknown release cause ' .. tostring(cause))
      end
      close(s, cause)
    elseif idle() then
      close(s, 'idle')
    else
      return reply(s, 0, 'open', '', nil)
    end
  end
  return reply(s, 1, '', string.format('%d', give_back_grant(token)), nil)
end
return redis.error_reply('unknown member op ' .. tostring(op))
