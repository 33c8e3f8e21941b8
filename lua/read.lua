-- read.lua: what snapshot.lua tells of one breaker, for a reader of many at once
-- (breaker_redis/reader.py: the CLI's status, metrics, the Flask dashboard),
-- pipelined one call per breaker. Two differences, both for a reader's speed:
-- the reply is one string, the values without their names, so the client
-- parses one reply element per breaker instead of some fifty (most of the
-- time of reading 2,000 breakers in Python); and the config may be the one
-- the workers stored with the state, so reading needs no round trip before
-- this one. Writes nothing: a reader has no counts kept in memory to flush.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common; 5: the config to read with, or '' for the one in the cfg key
-- Returns '<bytes of cfg> <bytes of config>\n' .. cfg .. config .. fields, where
--         cfg is the text read with when ARGV 5 was '' (else ''), config the config
--         the scripts apply (snapshot.lua's 'config'), and fields the values of
--         snapshot.lua's fields up to 'overrides', in its order but without their
--         names (breaker_redis/reader.py READ_FIELDS), as JSON (an empty hash as {}).
--         When fields cannot be encoded (a hash edited to hold a number such as
--         1e999): the list {cfg, fields, config}. With ARGV 5 '' and no cfg key: '',
--         and nothing was read.
local stored = ''
if ARGV[5] == '' then
  stored = redis.call('GET', K_CFG)
  if not stored then return '' end
  ARGV[5] = stored  -- load_config() reads it there; one that does not decode fails the call
end
local s = load_state()
local cfg = load_config()
local w = window_read(cfg)
local probes = #probe_ids()
local out = {s.state, s.epoch, s.open_until, s.forced, s.consec, s.open_ms, s.ho_ok, w.tc, w.tf, w.ts,
  probes, redis.call('ZCARD', K_LEASES) - probes, NOW, cfg.mode,
  redis.call('HGETALL', K_STATS), redis.call('HGETALL', K_CONFIG)}
local encoded, config_json = pcall(cjson.encode, cfg)  -- '' if an override made it unencodable (inf)
if not encoded then config_json = '' end
local ok, fields = pcall(cjson.encode, out)
if not ok then return {stored, out, config_json} end
return #stored .. ' ' .. #config_json .. '\n' .. stored .. config_json .. fields
