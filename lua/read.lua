-- read.lua: what snapshot.lua tells of one breaker, for a reader of many at once
-- (breaker_redis/reader.py: the CLI's status, metrics, the Flask dashboard),
-- pipelined one call per breaker. Two differences, both for a reader's speed:
-- the reply is one JSON text, so the client parses one string per breaker
-- instead of some fifty reply elements; and the config may be the one the
-- workers stored with the state, so reading needs no round trip before this
-- one. Writes nothing: a reader has no counts kept in memory to flush.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common; 5: the config to read with, or '' for the one in the cfg key
-- Returns JSON {cfg, fields}: cfg is the text read with when ARGV 5 was '' (else
--         ''), fields snapshot.lua's flat field, value list (an empty hash as {}).
--         With ARGV 5 '' and no cfg key: {''} and nothing read. When it cannot be
--         encoded (a hash edited to hold a number such as 1e999), the same as a list.
local stored = ''
if ARGV[5] == '' then
  stored = redis.call('GET', K_CFG)
  if not stored then return cjson.encode({''}) end
  ARGV[5] = stored  -- load_config() reads it there; one that does not decode fails the call
end
local s = load_state()
local cfg = load_config()
local w = window_read(cfg)
local probes = #probe_ids()
local out = {'state', s.state, 'epoch', s.epoch, 'open_until', s.open_until, 'forced', s.forced,
  'consec', s.consec, 'open_ms', s.open_ms, 'ho_ok', s.ho_ok,
  'window_calls', w.tc, 'window_failures', w.tf, 'window_slow', w.ts,
  'probes', probes, 'armed', s.armed and 1 or 0, 'arms', s.arms, 'born', s.born,
  'slots', redis.call('ZCARD', K_LEASES) - probes, 'now', NOW, 'mode', cfg.mode,
  'stats', redis.call('HGETALL', K_STATS), 'overrides', redis.call('HGETALL', K_CONFIG)}
local encoded, config_json = pcall(cjson.encode, cfg)  -- '' if an override made it unencodable (inf)
out[#out + 1] = 'config'
out[#out + 1] = encoded and config_json or ''
local ok, reply = pcall(cjson.encode, {stored, out})
if ok then return reply end
return {stored, out}
