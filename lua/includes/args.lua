-- args.lua: each script's own arguments (ARGV 7 on), named once.
--
-- A script reads `local a = args.<script>(ARGV)`, then a.<name>, never ARGV[i]. The
-- names and their order are those of the Python dataclasses that build the lists a
-- worker sends (breaker_redis/storage/args.py; tests/test_lua_args.py keeps the two
-- equal, so neither can drift). Values stay the strings sent: each script parses
-- what it uses, where it uses it (most calls read few of them). ARGV 1-6, the same
-- for every script, are begin()'s (call.lua; lua/_lib.lua's header). acquire,
-- record and snapshot carry what the worker counted in memory since its last flush
-- (rejected .. slow: flush_pending, stats.lua). health and sweep take none.
local args = {}

-- ARGV from `from` on, as a list (configure's field, value pairs).
local function rest(argv, from)
  local out = {}
  for i = from, #argv do out[i - from + 1] = argv[i] end
  return out
end

function args.acquire(argv)
  return {rejected = argv[7], would_reject = argv[8], successes = argv[9], failures = argv[10],
    ignored = argv[11], slow = argv[12],
    reporter = argv[13]}  -- read only with min_reporters > 1 ("One sick host", reporters.lua)
end

function args.record(argv)
  return {epoch = argv[7],  -- the epoch the permit was issued under
    outcome = argv[8],  -- success | failure | ignored, or '' for a batch alone
    duration_ms = argv[9],
    lease = argv[10],  -- '' or the lease ids acquire.lua handed out, space-separated
    rejected = argv[11], would_reject = argv[12], successes = argv[13], failures = argv[14],
    ignored = argv[15], slow = argv[16],
    batch_epoch = argv[17], batch = argv[18],  -- the batched successes: their epoch, how many
    reporter = argv[19]}
end

function args.snapshot(argv)
  return {rejected = argv[7], would_reject = argv[8], successes = argv[9], failures = argv[10],
    ignored = argv[11], slow = argv[12]}
end

function args.admin(argv)
  return {op = argv[7]}  -- force_open | force_closed | clear_force | trip | half_open | reset
end

function args.configure(argv)
  return {changes = rest(argv, 7)}  -- field, value pairs ('' removes the override)
end

function args.hold(argv)
  return {ms = argv[7]}  -- how long from now the breaker stays open at least
end

function args.member(argv)
  return {op = argv[7],  -- grant | revoke | release
    token = argv[8], cause = argv[9]}  -- cause: release's ('released' or 'not_listed')
end

function args.read(argv)
  return {fields = argv[7]}  -- '1': the config in force left out when unchanged; 'encode'
end

-- group.lua: the arguments after op depend on it.
function args.group(argv)
  local op = argv[7]
  if op == 'join' then
    return {op = argv[7], fraction = argv[8], cap = argv[9], members = argv[10], digest = argv[11]}
  elseif op == 'ask' then
    return {op = argv[7], member = argv[8], cap = argv[9]}
  elseif op == 'release' then
    return {op = argv[7], member = argv[8], token = argv[9]}
  end
  return {op = argv[7]}  -- read, or an unknown op (the script refuses it)
end
