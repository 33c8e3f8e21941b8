-- group.lua: a breaker group's grants, in the group's own slot. A group is a pool of
-- replica hosts, each with its breaker; at most `cap` of them may be open at once
-- (breaker_redis/groups.py computes it from max_open_fraction). A member opens only
-- holding a grant (group_holds_back in _lib.lua); this script hands them out, one per
-- member, never more than cap at a time, and takes one back only when member.lua has
-- revoked it in the member's slot (the member was closed then, and cannot open with it
-- afterwards). So at every moment the open members hold grants this hash lists.
--
-- KEYS  : 1 the group's hash, <prefix>:group:{GROUP}:
--           members (space-separated names), fraction, cap (as the last worker joining
--           said), seq (the last token), h:<member> (the token a member holds),
--           grants and held (counters: grants handed out, trips held back at the cap)
-- ARGV  : 1-4 common (5 and 6 unused); 7 op:
--   join     8 max_open_fraction, 9 cap, 10 members: describe the group (for readers)
--   ask      8 member, 9 cap: the member's grant: the one it holds, or a new one while
--            fewer than cap are held
--   release  8 member, 9 token: forget the member's grant if it is that token (revoked)
--   read     nothing
-- Returns: join, release: 1 (release: 0 if the member held another token or none);
--          ask: {1, token} granted, or {0, 0, holder, token, ...} refused at the cap;
--          read: the hash as field, value pairs and 'now', NOW.
local key, op = KEYS[1], ARGV[7]

local function holders()
  local found, all = {}, redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'h:' then
      found[#found + 1], found[#found + 2] = string.sub(all[i], 3), all[i + 1]
    end
  end
  return found
end

if op == 'join' then
  redis.call('HSET', key, 'fraction', ARGV[8], 'cap', ARGV[9], 'members', ARGV[10])
  return 1
elseif op == 'ask' then
  local member, cap = ARGV[8], tonumber(ARGV[9]) or 1
  local held = redis.call('HMGET', key, 'h:' .. member)[1]
  if held then return {1, held} end
  local found = holders()
  if #found / 2 < cap then
    -- tokens rise above the clock too: a hash lost and created anew never hands out
    -- a token a member has already seen revoked
    local token = math.max((tonumber(redis.call('HMGET', key, 'seq')[1]) or 0) + 1, NOW)
    redis.call('HSET', key, 'seq', token, 'h:' .. member, token)
    redis.call('HINCRBY', key, 'grants', 1)
    return {1, tostring(token)}
  end
  redis.call('HINCRBY', key, 'held', 1)
  local refused = {0, 0}
  for i = 1, #found do refused[#refused + 1] = found[i] end
  return refused
elseif op == 'release' then
  if redis.call('HMGET', key, 'h:' .. ARGV[8])[1] ~= ARGV[9] then return 0 end
  redis.call('HDEL', key, 'h:' .. ARGV[8])
  return 1
elseif op == 'read' then
  local all = redis.call('HGETALL', key)
  all[#all + 1], all[#all + 2] = 'now', NOW
  return all
end
return redis.error_reply('unknown group op ' .. tostring(op))
