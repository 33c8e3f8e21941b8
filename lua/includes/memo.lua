-- memo.lua: the memos that spare a script work it did before: numbers parsed, texts
-- derived (memo), bucket ids formatted, and the scratch table writes are built in.
--
-- tonumber for the values a script reads again and again (epochs, times, the
-- state's fields, ARGV): Lua's tonumber costs two strtod calls, a lookup here a
-- fraction of one. A value Redis or a caller gives as the same text is one
-- interned Lua string, so the memo is keyed by it. Strings only (a hash field,
-- an argument); at most NUMS_KEPT kept, then it starts afresh.
local NUMS, NUMS_N, NUMS_KEPT = {}, 0, 256
local function num(x)
  if not x then return nil end  -- false: a field missing from the hash
  local n = NUMS[x]
  if n == nil then
    n = tonumber(x)
    if n == nil then return nil end
    if NUMS_N >= NUMS_KEPT then NUMS, NUMS_N = {}, 0 end
    NUMS[x], NUMS_N = n, NUMS_N + 1
  end
  return n
end

-- What a script derives from an argument's text (its channels, the key TTL's
-- refresh period, ARGV 6), kept per text in MEMO[kind]: as a library the
-- prelude's upvalues outlive a call, and a worker sends the same text call
-- after call. A derived value is shared by later calls: never changed.
local MEMO, MEMO_KEPT = {}, 64
local function memo(kind, text, derive)
  local m = MEMO[kind]
  if m == nil or m[0] >= MEMO_KEPT then m = {[0] = 0}; MEMO[kind] = m end
  local d = m[text]
  if d == nil then
    d = derive(text)
    m[text], m[0] = d, m[0] + 1
  end
  return d
end

-- tostring for a bucket id, kept the same way (Lua formats a number with sprintf)
local STRS, STRS_N = {}, 0
local function str(n)
  local x = STRS[n]
  if x == nil then
    x = tostring(n)
    if STRS_N >= NUMS_KEPT then STRS, STRS_N = {}, 0 end
    STRS[n], STRS_N = x, STRS_N + 1
  end
  return x
end

local SCRATCH = {}  -- the fields a write sends (save_state, window_add), kept: one table fewer per call
