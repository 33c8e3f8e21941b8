-- snapshot.lua: everything known about one breaker, for snapshot(), the CLI
-- and metrics. Changes no state (transitions happen only in acquire/record);
-- it does flush the caller's pending rejection counts so they show at once.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common (5: config); 7 on: `a` below, what the worker
--         counted in memory (see flush_pending)
-- Reads : state, window, leases, config, stats.  Writes: stats (flush only).
-- Returns a flat field, value list: state fields, window totals as of now,
--         probes in flight, now, then 'stats' and the stats hash, then
--         'overrides' and the config hash, with min_reporters > 1 'reporters' (see
--         reporters_view in includes/quorum.lua), then 'config': the config the scripts
--         apply (ARGV 5 with the live overrides), as JSON in the units of ARGV 5
--         ('' if it cannot be encoded).
-- This script's own arguments, named once (breaker_redis/storage/args.py SnapshotArgs; docs/wire.md):
local a = {rejected = ARGV[7], would_reject = ARGV[8], successes = ARGV[9],
  failures = ARGV[10], ignored = ARGV[11], slow = ARGV[12]}
local s = load_state()
local cfg = load_config()
flush_pending(a)
local w = window_now(cfg)
local probes = #probe_ids()
local out = {'state', s.state, 'epoch', s.epoch, 'open_until', s.open_until, 'forced', s.forced,
  'consec', s.consec, 'open_ms', s.open_ms, 'ho_ok', s.ho_ok,
  'window_calls', w.tc, 'window_failures', w.tf, 'window_slow', w.ts,
  'probes', probes, 'armed', s.armed and 1 or 0, 'arms', s.arms, 'born', s.born, 'slots', redis.call('ZCARD', K_LEASES) - probes, 'now', NOW,
  'mode', cfg.mode, 'ramp_until', s.ramp_until}
out[#out + 1] = 'stats'
out[#out + 1] = redis.call('HGETALL', K_STATS)
out[#out + 1] = 'overrides'
out[#out + 1] = redis.call('HGETALL', K_CONFIG)
if cfg.min_rep then  -- min_reporters > 1: the reporters failing in the window, the isolated ones
  out[#out + 1] = 'reporters'
  out[#out + 1] = reporters_view(cfg)
end
out[#out + 1] = 'config'
local encoded, config_json = pcall(cjson.encode, cfg)  -- '' if an override made it unencodable (inf)
out[#out + 1] = encoded and config_json or ''
return out
