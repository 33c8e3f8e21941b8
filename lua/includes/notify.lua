-- notify.lua: the pub/sub messages: announce, notify (acknowledged notices) and publish.
--
-- One message to everyone who reads the events: PUBLISH on <prefix>:events (the CLI's
-- events --follow, the dashboard, anyone's redis-cli), and on the workers' channel
-- (WORKERS: '<prefix>:notices:<db>', or on Redis Cluster the breaker's own sharded channel,
-- SPUBLISH, which only its master's subscribers hear).
local function announce(message)
  redis.call('PUBLISH', CHANNEL, message)
  if SHARD ~= '' then return redis.call('SPUBLISH', SHARD, message) end
  return redis.call('PUBLISH', WORKERS, message)
end

-- A notice the caller waits for (docs/boundary.md, "The boundary"): the message carries
-- this call's token, every worker that reads it on the workers' channel counts it in
-- <prefix>:{NAME}:acks (HINCRBY <token> 1) once it has applied it, and the reply's last
-- field, '<token> <workers>', tells the caller how many to wait for: as many as the
-- PUBLISH (SPUBLISH) reached. Only workers listen there, so a dashboard or a redis-cli
-- watching <prefix>:events is not waited for. The hash expires a minute after its last
-- notice; a token is the time and a count kept there, so none is ever used twice.
local ACKS_TTL_MS = 60000
-- Every message's format (its JSON keys, per kind): docs/wire.md, "Pub/sub messages".
local function notify(msg)
  if ACK == nil then
    local acks = string.sub(K_STATE, 1, -6) .. 'acks'  -- '<prefix>:{NAME}:state' -> ...:acks
    local seq = redis.pcall('HINCRBY', acks, ' seq', 1)
    if type(seq) == 'table' then  -- another type, written there by hand
      redis.call('DEL', acks)
      seq = redis.call('HINCRBY', acks, ' seq', 1)
    end
    redis.call('PEXPIRE', acks, ACKS_TTL_MS)
    ACK = {string.format('%d-%d', NOW, seq), 0}
  end
  msg.ack = ACK[1]
  ACK[2] = ACK[2] + announce(cjson.encode(msg))
end

-- Every transition: epoch+1, one line in the events list, one pub/sub message. Messages
-- are hints: a worker that hears one asks Redis again before trusting memory.
local function publish(s, kind, extra)
  local msg = {name = NAME, kind = kind, epoch = s.epoch, arms = s.arms, born = s.born, db = DB, at = NOW}
  for k, v in pairs(extra or {}) do msg[k] = v end
  notify(msg)
end
