-- window.lua: the sliding window of calls, failures and slow calls (the window hash).
--
-- Window: buckets of bms ms; bucket ids in (head - nb, head] are live.
-- Its shape (bms, nb) is the caller's, or, while two configs overlap (a
-- rolling deploy), the shape it already has: a caller with another shape
-- adopts the stored one as long as a caller of that shape wrote it in the
-- last WINDOW_CLAIM_MS (sat: when), so the window is kept rather than wiped
-- by each config in turn; once no one claims it, the next caller's shape
-- replaces it (one reset). Every caller applies its own thresholds to it.
-- Returns the totals as of NOW, the current bucket's counters, the ids that
-- slid out (for the writer to drop), the shape in use and whether the hash
-- starts afresh.
local WINDOW_CLAIM_MS = 60000
-- with_f, with_s: whether the current bucket's f (s) is read, for a caller that
-- adds to it or judges a rate by it (see window_add); otherwise it reads as 0.
-- A success, a batch, a snapshot read neither (a field missing from the hash
-- costs a scan of all of it).
local function window_read(c, with_f, with_s)
  local bms, nb = c.bucket_ms, c.buckets
  local q = NOW / bms
  local cur = q - q % 1  -- math.floor without a call
  local sid = str(cur)  -- one number formatting, not three
  local w
  -- w: head, bms, tc, tf, ts, c, nb, sat, then f and s of the current bucket (nil when not read:
  -- the reply's own table is not grown for them)
  if with_f and with_s then
    w = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'tc', 'tf', 'ts', 'c' .. sid, 'nb', 'sat', 'f' .. sid,
      's' .. sid)
  elseif with_f then
    w = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'tc', 'tf', 'ts', 'c' .. sid, 'nb', 'sat', 'f' .. sid)
  elseif with_s then
    w = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'tc', 'tf', 'ts', 'c' .. sid, 'nb', 'sat', 's' .. sid)
    w[9], w[10] = false, w[9]
  else
    w = redis.call('HMGET', K_WINDOW, 'head', 'bms', 'tc', 'tf', 'ts', 'c' .. sid, 'nb', 'sat')
  end
  local N = NUMS  -- N[x] or num(x): as in load_state
  local head, tc = N[w[1]] or num(w[1]), N[w[3]] or num(w[3]) or 0
  local tf, ts = N[w[4]] or num(w[4]) or 0, N[w[5]] or num(w[5]) or 0
  local sbms, snb = N[w[2]] or num(w[2]), N[w[7]] or num(w[7]) or nb  -- a hash from before nb was written: ours
  local adopted = false
  if head and (sbms ~= bms or snb ~= nb) then
    local sane = sbms and sbms >= 1 and sbms == math.floor(sbms) and snb >= 1 and snb <= 100
      and snb == math.floor(snb)
    local claimed = (tonumber(w[8]) or -math.huge) > NOW - WINDOW_CLAIM_MS
    if sane and claimed then
      bms, nb, adopted = sbms, snb, true
      cur = math.floor(NOW / bms)
      local b = redis.call('HMGET', K_WINDOW, 'c' .. cur, 'f' .. cur, 's' .. cur)
      w[6], w[9], w[10] = b[1], b[2], b[3]
    end
  end
  -- a head more than a day ahead of the clock was not written by a worker (a clock
  -- step back counts into the head bucket, below): the window would never slide
  local edited = (w[1] and not head) or (head and (head - cur) * bms > 86400000)
  if edited then repaired('window') end
  if head == nil or edited or (not adopted and (sbms ~= bms or snb ~= nb)) or tc < 0 or tf < 0 or ts < 0
    or cur - nb >= head then
    return {cur = cur, tc = 0, tf = 0, ts = 0, bc = 0, bf = 0, bs = 0, bms = c.bucket_ms, nb = c.buckets,
      adopted = false, reset = true}
  end
  if cur < head then -- a clock step back counts into the head bucket
    cur = head
    local b = redis.call('HMGET', K_WINDOW, 'c' .. cur, 'f' .. cur, 's' .. cur)
    w[6], w[9], w[10] = b[1], b[2], b[3]
  end
  -- Buckets that slid out: ids head-nb+1 .. cur-nb. The hash is usually a
  -- listpack, where each field read or dropped by name costs a scan, and so
  -- does each field written into it. Up to two thirds of the window slid out,
  -- those buckets are read and dropped by name; beyond, one pass reads the
  -- hash, sums the buckets that stay, and the writer rebuilds it with them.
  -- Worst case with 100 full buckets (window_buckets' bound): about 0.26 ms,
  -- where either way alone costs up to about 0.45 ms (measured on Redis 7).
  local gone, kept = nil, nil
  if (cur - head) * 3 > nb * 2 then
    local all = redis.call('HGETALL', K_WINDOW)
    local totals = {c = 0, f = 0, s = 0}
    kept = {}
    local fcur, scur = 'f' .. cur, 's' .. cur
    for i = 1, #all, 2 do
      if all[i] == fcur then w[9] = all[i + 1] elseif all[i] == scur then w[10] = all[i + 1] end
      local kind, id = string.sub(all[i], 1, 1), tonumber(string.sub(all[i], 2))
      if id and totals[kind] and id > cur - nb and id <= head then
        local value = tonumber(all[i + 1]) or 0
        totals[kind] = totals[kind] + value
        kept[#kept + 1], kept[#kept + 2] = all[i], value
      end
    end
    tc, tf, ts = totals.c, totals.f, totals.s
  else
    for id = head - nb + 1, cur - nb do
      gone = gone or {}
      local n, sid = #gone, tostring(id)
      gone[n + 1], gone[n + 2], gone[n + 3] = 'c' .. sid, 'f' .. sid, 's' .. sid
    end
    if gone then
      local b = redis.call('HMGET', K_WINDOW, unpack(gone))
      for i = 1, #gone, 3 do
        tc, tf, ts = tc - (tonumber(b[i]) or 0), tf - (tonumber(b[i + 1]) or 0), ts - (tonumber(b[i + 2]) or 0)
      end
    end
  end
  return {cur = cur, tc = tc < 0 and 0 or tc, tf = tf < 0 and 0 or tf, ts = ts < 0 and 0 or ts,
    bc = N[w[6]] or num(w[6]) or 0, bf = w[9] and (N[w[9]] or num(w[9])) or 0,
    bs = w[10] and (N[w[10]] or num(w[10])) or 0, gone = gone,
    kept = kept, sat = N[w[8]] or num(w[8]), head = head, bms = bms, nb = nb, adopted = adopted, reset = false}
end

-- The counts of the window's oldest bucket, the next to slide out (c, f, s), or
-- nil when the window is one bucket or starts afresh. For update_armed: sliding
-- raises a rate when the oldest bucket was healthier than the rest.
local function oldest_bucket(w)
  if w.reset or w.nb < 2 then return nil end
  local id = w.cur - w.nb + 1
  if id > w.head then return nil end  -- nothing was counted before the current bucket
  local b = redis.call('HMGET', K_WINDOW, 'c' .. id, 'f' .. id, 's' .. id)
  return {c = num(b[1]) or 0, f = num(b[2]) or 0, s = num(b[3]) or 0}
end

local SAT_EVERY_MS = 5000  -- a shape's claim (sat) is renewed this often, well within WINDOW_CLAIM_MS
local function window_add(c, calls, failures, slows)
  -- f and s as they are where they are written here or judged (slide_may_arm: the rate
  -- rule by f, the slow-call rule by s) once this call adds to the bucket
  local w = window_read(c, failures ~= 0 or (slows ~= 0 and c.trip == 'rate'),
    slows ~= 0 or (failures ~= 0 and c.slow_ms > 0))
  local fresh = w.reset or w.kept ~= nil  -- the hash is written anew
  if fresh then redis.call('DEL', K_WINDOW) end
  if w.gone then redis.call('HDEL', K_WINDOW, unpack(w.gone)) end
  if w.kept and #w.kept > 0 then redis.call('HSET', K_WINDOW, unpack(w.kept)) end
  local sid = str(w.cur)
  w.tc, w.tf, w.ts = w.tc + calls, w.tf + failures, w.ts + slows
  -- Only the fields that change (a missing one reads as 0): a success in the
  -- current bucket writes two, where every field each time cost the record
  -- script a third of its server time.
  local f, n = SCRATCH, 4  -- (unpack(f, 1, n): only what this call put there is sent)
  f[1], f[2], f[3], f[4] = 'tc', w.tc, 'c' .. sid, w.bc + calls
  if fresh or w.head ~= w.cur then f[n + 1], f[n + 2], n = 'head', sid, n + 2 end
  if fresh then f[n + 1], f[n + 2], f[n + 3], f[n + 4], n = 'bms', w.bms, 'nb', w.nb, n + 4 end
  if fresh or failures ~= 0 or w.gone then f[n + 1], f[n + 2], n = 'tf', w.tf, n + 2 end  -- a slide changes it
  if fresh or slows ~= 0 or w.gone then f[n + 1], f[n + 2], n = 'ts', w.ts, n + 2 end
  if fresh or failures ~= 0 then f[n + 1], f[n + 2], n = 'f' .. sid, w.bf + failures, n + 2 end
  if fresh or slows ~= 0 then f[n + 1], f[n + 2], n = 's' .. sid, w.bs + slows, n + 2 end
  if w.adopted or c.no_claim then  -- the shape is another caller's: its claim is kept as it was
    if w.kept and w.sat then f[n + 1], f[n + 2], n = 'sat', w.sat, n + 2 end
  elseif fresh or not w.sat or NOW - w.sat >= SAT_EVERY_MS or NOW < w.sat then
    f[n + 1], f[n + 2], n = 'sat', NOW, n + 2  -- this shape claimed
  end
  redis.call('HSET', K_WINDOW, unpack(f, 1, n))
  return w
end
