-- read.lua: what snapshot.lua tells of one breaker, for a reader of many at once
-- (breaker_redis/ops/reader.py: the CLI's status, metrics, the Flask dashboard),
-- pipelined one call per breaker. It differs for a reader's speed only: the
-- reply is one string, the values without their names, so the client parses
-- one reply element per breaker instead of some fifty (most of the time of
-- reading 2,000 breakers in Python); the config may be the one the workers
-- stored with the state, so reading needs no round trip before this one; and
-- the config in force is left out where no live override changes it (the
-- reader asks once per config text, ARGV 7 'encode'). Writes nothing: a
-- reader has no counts kept in memory to flush.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common; 5: the config to read with, or '' for the one in the cfg key;
--         7 (a.fields): '1' to leave the config in force out ('=' in its place) when the
--         config hash is empty; 'encode' to reply only the config in force of
--         ARGV 5 with no override (as snapshot.lua's 'config'), reading nothing
-- Returns '<bytes of cfg> <bytes of config>\n' .. cfg .. config .. fields, where
--         cfg is the text read with when ARGV 5 was '' (else ''), config the config
--         the scripts apply (snapshot.lua's 'config', or '='), and fields the values
--         of snapshot.lua's fields up to 'overrides', in its order but without their
--         names (breaker_redis/ops/reader.py READ_FIELDS), as JSON (an empty hash as {}),
--         and with min_reporters > 1 snapshot.lua's 'reporters' after them.
--         When fields cannot be encoded (a hash edited to hold a number such as
--         1e999): the list {cfg, fields, config}. With ARGV 5 '' and no cfg key: '',
--         and nothing was read.
-- This script's own arguments, named once (breaker_redis/storage/args.py ReadArgs; docs/wire.md):
local a = {fields = ARGV[7]}
if a.fields == 'encode' then
  local encoded, config_json = pcall(cjson.encode, cjson.decode(ARGV[5]))
  return encoded and config_json or ''
end
local stored = ''
if ARGV[5] == '' then
  stored = redis.call('GET', K_CFG)
  if not stored then return '' end
  ARGV[5] = stored  -- load_config() reads it there; one that does not decode fails the call
end
local s = load_state()
local cfg = load_config()
local w = window_now(cfg)
local probes = #probe_ids()
local overrides = redis.call('HGETALL', K_CONFIG)
local out = {s.state, s.epoch, s.open_until, s.forced, s.consec, s.open_ms, s.ho_ok, w.tc, w.tf, w.ts,
  probes, redis.call('ZCARD', K_LEASES) - probes, NOW, cfg.mode, s.ramp_until, redis.call('HGETALL', K_STATS),
  overrides}
if cfg.min_rep then out[#out + 1] = reporters_view(cfg) end  -- min_reporters > 1: 'reporters'
local config_json = '='
if a.fields ~= '1' or #overrides > 0 then
  local encoded, text = pcall(cjson.encode, cfg)  -- '' if an override made it unencodable (inf)
  config_json = encoded and text or ''
end
local ok, fields = pcall(cjson.encode, out)
if not ok then return {stored, out, config_json} end
return #stored .. ' ' .. #config_json .. '\n' .. stored .. config_json .. fields
