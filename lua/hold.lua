-- hold.lua: keep an open breaker open until at least a moment its service named.
-- A service that answers 503 or 429 with Retry-After says when to come back;
-- the HTTP client integrations (breaker_redis/web/clients.py) run this after a
-- failure that carried one left the breaker open, so every worker refuses
-- until then, not only until the breaker's own open period ends. The period
-- is never made shorter, and never longer than max_open_seconds from now.
-- No transition and no message: a worker that knows the earlier open_until
-- asks Redis when it passes (knowledge.py), and this reply carries the new one.
--
-- KEYS  : state, window, leases, config, stats, events, cfg (see _lib.lua)
-- ARGV  : 1-6 common (5: config); 7 how long from now, in ms
-- Reads : state, config.  Writes: state (open_until).
-- Returns the common reply (allowed 1, reason '' or 'unchanged').
-- This script's own arguments, named once (breaker_redis/storage/args.py HoldArgs; docs/wire.md):
local a = {ms = ARGV[7]}
local s = load_state()
local cfg = load_config()
local ms = math.min(tonumber(a.ms) or 0, cfg.max_open_ms)
if s.state ~= 'open' or s.forced ~= '' or ms ~= ms or NOW + ms <= s.open_until then
  return reply(s, 1, 'unchanged', '', cfg)
end
s.open_until, s.dirty = NOW + math.floor(ms), true
return reply(s, 1, '', '', cfg)
