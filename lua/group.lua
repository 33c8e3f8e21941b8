-- group.lua: a breaker group's grants, in the group's own slot. A group is a pool of
-- replica hosts, each with its breaker; at most `cap` of them may be open at once
-- (breaker_redis/groups.py computes it from max_open_fraction). A member opens only
-- holding a grant (group_holds_back in includes/grants.lua); this script hands them out, one per
-- member, never more than cap at a time, and forgets one only once member.lua (or a
-- close, give_back_grant in includes/grants.lua) has revoked it in the member's slot: the member was
-- closed then, and cannot open with it afterwards. So at every moment the open members
-- hold grants this hash lists.
--
-- Which members the group has, and its cap, are the newest config's: each config a worker
-- joins with (its member list and max_open_fraction, named by a digest the worker sends) is
-- remembered with when a worker first and last joined with it, and the one first seen most
-- recently is the group's (a deploy's new member list wins; a worker of the previous
-- version starting late does not take it back). A config no worker has joined with for
-- FORGET_MS is forgotten, so a rollback to a list seen before wins once the newer one's
-- workers are gone. Workers join when they start and each time they find the cap full
-- (at most once a second). A member the newest config does not list gets no grant, and its
-- grant is taken back first when the cap is full (groups.py).
--
-- KEYS  : 1 the group's hash, <prefix>:group:{GROUP}:
--           members (space-separated names), fraction, cap: the newest config's;
--           v:<digest> 'first last cap fraction members' per config joined with (ms);
--           seq (the last token), h:<member> (the token a member holds),
--           grants and held (counters: grants handed out, trips held back at the cap)
-- ARGV  : 1-4 common (5 and 6 unused); 7 op, then the op's own (`a` below):
--   join     8 max_open_fraction, 9 cap, 10 members, 11 the config's digest (hex): this
--            worker's config seen now; answers the newest config's members and cap
--   ask      8 member, 9 cap (the asker's: the cap when no config is known): the member's
--            grant: the one it holds, or a new one while it is listed and fewer than the cap
--            are held
--   release  8 member, 9 token: forget the member's grant if it is that token or an earlier
--            one (member.lua revoked every token up to it)
--   read     nothing
-- Every value read from the hash is checked: a config record that does not parse is
-- dropped, a grant that is not a token reads as the highest token handed out (seq) and is
-- written so, a seq that is not one as the clock (tokens rise above it).
-- Returns: join: {members, cap}; release: 1, or 0 if the member held a later token or none;
--          ask: {1, token} granted, or {0, 0, holder, token, ...} refused;
--          read: the hash as field, value pairs and 'now', NOW.
-- This script's own arguments, named once, by op (breaker_redis/storage/args.py Group<Op>Args; docs/wire.md):
local a
if ARGV[7] == 'join' then
  a = {op = ARGV[7], fraction = ARGV[8], cap = ARGV[9], members = ARGV[10], digest = ARGV[11]}
elseif ARGV[7] == 'ask' then
  a = {op = ARGV[7], member = ARGV[8], cap = ARGV[9]}
elseif ARGV[7] == 'release' then
  a = {op = ARGV[7], member = ARGV[8], token = ARGV[9]}
else
  a = {op = ARGV[7]}  -- read, or an unknown op (refused below)
end
local key, op = KEYS[1], a.op
local FORGET_MS = 600000

-- The highest token handed out: every token a member can hold is at most this.
local function seq()
  local n = token_of(redis.call('HMGET', key, 'seq')[1])
  if n then return n end
  return NOW
end

-- The grants: {member, token, ...}; a grant that is not a token is written as seq.
local function holders()
  local found, all, top = {}, redis.call('HGETALL', key), nil
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'h:' then
      local held = token_of(all[i + 1])
      if not held then
        top = top or seq()
        held = top
        redis.call('HSET', key, all[i], string.format('%d', held))
      end
      found[#found + 1], found[#found + 2] = string.sub(all[i], 3), string.format('%d', held)
    end
  end
  return found
end

local function positive_integer(x)
  local n = token_of(x)
  if n and n >= 1 then return n end
  return nil
end

local function fraction_of(x)
  if type(x) ~= 'string' or string.find(x, '[^%d%.eE+-]') then return nil end
  local n = tonumber(x)
  if n and n > 0 and n <= 1 then return n end
  return nil
end

local function names_of(x)  -- a member list: names (no whitespace) separated by single spaces
  if type(x) ~= 'string' or string.find(x, '  ', 1, true) then return nil end
  if string.find(x, '^%S+$') or string.find(x, '^%S[%S ]*%S$') then return x end
  return nil
end

-- A counter: one more; one edited into something else starts again from 1.
local function count(field)
  local n = redis.pcall('HINCRBY', key, field, 1)
  if type(n) == 'table' then redis.call('HSET', key, field, 1) end
end

-- A config record: {first, last, cap, fraction, members}, or nil when it does not parse.
-- (its format: docs/wire.md, "Hash records")
local function config_of(v)
  if type(v) ~= 'string' then return nil end
  local first, last, cap, fraction, members = string.match(v, '^(%d+) (%d+) (%d+) (%S+) (.+)$')
  first, last, cap, members = token_of(first), token_of(last), positive_integer(cap), names_of(members)
  if not (first and last and cap and fraction_of(fraction) and members) then return nil end
  return {first = first, last = last, cap = cap, fraction = fraction, members = members}
end

local function listed(members, member)
  return string.find(' ' .. members .. ' ', ' ' .. member .. ' ', 1, true) ~= nil
end

if op == 'join' then
  local fraction, cap, members, digest = a.fraction, positive_integer(a.cap), names_of(a.members), a.digest
  if not (fraction_of(fraction) and cap and members and type(digest) == 'string' and string.find(digest, '^%x+$')
    and #digest <= 64) then
    return redis.error_reply('group join: bad arguments')
  end
  local all, newest, newest_id, drop = redis.call('HGETALL', key), nil, nil, {}
  local mine = {first = NOW, last = NOW, cap = cap, fraction = fraction, members = members}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'v:' then
      local id, config = string.sub(all[i], 3), config_of(all[i + 1])
      if id == digest and config then
        mine.first = math.min(config.first, NOW)  -- first seen then; this config as this worker has it
      elseif not config or config.last < NOW - FORGET_MS then
        drop[#drop + 1] = all[i]  -- forgotten (or edited into something that does not parse)
      elseif not newest or config.first > newest.first or (config.first == newest.first and id > newest_id) then
        newest, newest_id = config, id
      end
    end
  end
  if #drop > 0 then redis.call('HDEL', key, unpack(drop)) end
  redis.call('HSET', key, 'v:' .. digest, string.format('%d %d %d %s %s', mine.first, mine.last, mine.cap,
    mine.fraction, mine.members))
  if not newest or mine.first > newest.first or (mine.first == newest.first and digest > newest_id) then
    newest = mine
  end
  redis.call('HSET', key, 'fraction', newest.fraction, 'cap', string.format('%d', newest.cap),
    'members', newest.members)
  return {newest.members, newest.cap}
elseif op == 'ask' then
  local member = a.member
  local held = redis.call('HMGET', key, 'h:' .. member)[1]
  if held then
    local token = token_of(held)
    if not token then
      token = seq()
      redis.call('HSET', key, 'h:' .. member, string.format('%d', token))
    end
    return {1, string.format('%d', token)}
  end
  local v = redis.call('HMGET', key, 'members', 'cap')
  local members, cap = names_of(v[1]), positive_integer(v[2])
  if not (members and cap) then  -- no config known (the hash is new, or was edited): the asker's
    members, cap = nil, positive_integer(a.cap) or 1
  end
  local found = holders()
  if (members == nil or listed(members, member)) and #found / 2 < cap then
    -- tokens rise above the clock too: a hash lost and created anew never hands out
    -- a token a member has already seen revoked
    local token = math.max(seq() + 1, NOW)
    redis.call('HSET', key, 'seq', string.format('%d', token), 'h:' .. member, string.format('%d', token))
    count('grants')
    return {1, string.format('%d', token)}
  end
  count('held')
  local refused = {0, 0}
  for i = 1, #found do refused[#refused + 1] = found[i] end
  return refused
elseif op == 'release' then
  local upto, v = token_of(a.token), redis.call('HMGET', key, 'h:' .. a.member)[1]
  local held = v and (token_of(v) or seq())
  if not upto or not held or held > upto then return 0 end
  redis.call('HDEL', key, 'h:' .. a.member)
  return 1
elseif op == 'read' then
  local all = redis.call('HGETALL', key)
  all[#all + 1], all[#all + 2] = 'now', NOW
  return all
end
return redis.error_reply('unknown group op ' .. tostring(op))
