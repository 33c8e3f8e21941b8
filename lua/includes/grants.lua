-- grants.lua: a breaker group member's grant, in its own state hash (group_holds_back).
--
-- Breaker groups (see group_holds_back): a member's grant, the `grant` field of its
-- state hash, and `revoked`, the highest token taken back (every token up to it is dead:
-- member.lua refuses it). Tokens are integers (group.lua hands them out above the clock); a
-- field that is not one was edited by hand: nil, and the caller repairs it.
local MAX_TOKEN = 9007199254740991
local function token_of(x)
  if type(x) ~= 'string' or not string.find(x, '^%d+$') then return nil end
  local n = tonumber(x)
  if n > MAX_TOKEN then return nil end
  return n
end

-- The member's grant as stored: (held, revoked), each repaired when it is not a token (a
-- grant that is not one is dropped: the member holds none, and a trip is held back until
-- the group grants one; a revoked mark that is not one is raised to the grant's token or the
-- clock, which is above every token a group handed out before this call).
local function grant_fields()
  local v = redis.call('HMGET', K_STATE, 'grant', 'revoked')
  local held, revoked = token_of(v[1]), token_of(v[2])
  if v[1] and not held then
    redis.call('HDEL', K_STATE, 'grant')
    repaired('state')
  end
  if v[2] and not revoked then
    revoked = math.max(held or 0, NOW)
    redis.call('HSET', K_STATE, 'revoked', revoked)
    repaired('state')
  end
  return held, revoked or 0
end

-- A member no longer needs its grant (it closed, or was reset or forced closed): it gives it
-- back in its own slot, so the grant is tied to the open state it was granted for. Every
-- token up to the one held is revoked (member.lua refuses them from then on) and the reply's
-- events say 'released:<revoked>', so the worker has the group forget its grant (group.lua
-- release): in that order, the group never lists fewer grants than members are open.
-- Returns the highest token revoked (0: none ever).
local function give_back_grant(token)
  local held, revoked = grant_fields()
  local upto = math.max(revoked, held or 0, token or 0)
  if held then redis.call('HDEL', K_STATE, 'grant') end
  if upto > revoked then redis.call('HSET', K_STATE, 'revoked', upto) end
  if held then EVENTS = EVENTS .. (EVENTS == '' and '' or ',') .. 'released:' .. string.format('%d', upto) end
  return upto
end

-- Breaker groups: a pool of replica hosts of which at most a share may be open at
-- once (breaker_redis/groups.py; Envoy's max_ejection_percent). A member's config
-- names its group (c.group); it opens only holding the group's grant, the field
-- 'grant' of its state hash, which member.lua writes once group.lua, in the group's
-- own slot, handed out one of the group's few grants (docs/http-clients.md has why it
-- is two steps). Without one, a trip its rules call for is held back: the breaker
-- stays closed and keeps counting, and the reply's events say 'held', so the worker
-- asks the group and, granted, has member.lua trip it. Not in a group: nothing read.
local function group_holds_back(s, c)
  if not c.group or grant_fields() then return false end
  EVENTS = EVENTS .. (EVENTS == '' and '' or ',') .. 'held'
  return true
end
