-- rules.lua: the trip rules: armed or calm, which rule holds, open (with backoff) and close.
--
-- Armed: closed, and a success reaching Redis late could change a decision.
-- Workers batch successes only while calm, and a failure (every outcome but a
-- plain success) always goes at once carrying the worker's batch; the calm->armed
-- change is published, so every worker sends its batch and then every outcome at
-- once (docs/boundary.md, "Calm and armed", states the guarantee):
-- - consecutive rule: armed while the run of failures is above 0 (a success ends it);
-- - rate and slow-call rules: armed while REACH more failures (slow calls) could
--   make the rule hold, on the window as it is and as it will be once its oldest
--   bucket slid out (a slide can raise a rate between two records); far from its
--   threshold the breaker stays calm, so a background error rate costs one record
--   per failure and nothing per success. Once armed it calms again only beyond
--   twice that reach, so a rate hovering at the edge does not arm again and again.
-- The count rule ignores successes, so only its slow-call rule arms it.
-- With window_calls (a ring of n: ring.lua) k more failures make at most tf + k
-- failures in at most n calls; successes only slide outcomes out, never raising a rate.
local REACH = 20
local function within_reach(c, tc, tf, ts, k, n)
  local calls = n and math.min(n, tc + k) or tc + k
  if calls < (n and math.min(n, c.min_calls) or c.min_calls) then return false end
  return (c.trip == 'rate' and tf + k >= c.rate * calls)
    or (c.slow_ms > 0 and ts + k >= c.slow_rate * calls)
end

-- Whether sliding out the older buckets could bring the rule within reach: at
-- most it takes out every call of theirs that is not a failure (not slow). When
-- not, the oldest bucket is not read (the common case: a busy current bucket). A ring
-- slides only by the outcomes within_reach counts.
local function slide_may_arm(c, w, k)
  if w.reset or w.ring or w.tc + k < c.min_calls then return false end
  local older = w.tc - w.bc
  local tc_rate = w.tc - math.max(0, older - (w.tf - w.bf))
  local tc_slow = w.tc - math.max(0, older - (w.ts - w.bs))
  return (c.trip == 'rate' and w.tf + k >= c.rate * (tc_rate + k))
    or (c.slow_ms > 0 and w.ts + k >= c.slow_rate * (tc_slow + k))
end

local function update_armed(s, c, w)
  local armed = false
  if s.state == 'closed' and s.forced == '' then
    if c.trip == 'consecutive' and s.consec > 0 then
      armed = true
    elseif c.trip == 'rate' or c.slow_ms > 0 then
      local k = s.armed and 2 * REACH or REACH
      armed = within_reach(c, w.tc, w.tf, w.ts, k, w.ring and w.n)
      if not armed and slide_may_arm(c, w, k) then
        local old = oldest_bucket(w)
        armed = old ~= nil and within_reach(c, w.tc - old.c, w.tf - old.f, w.ts - old.s, k)
      end
    end
  end
  if armed == s.armed then return end
  s.armed, s.dirty = armed, true
  if armed then
    s.arms = s.arms + 1
    publish(s, 'armed', nil)
    EVENTS = EVENTS .. (EVENTS == '' and '' or ',') .. 'armed'
  end
end

-- Which trip rule holds for these window totals and consecutive count (nil: none).
local function trip_cause(c, w, consec)
  if c.trip == 'consecutive' and consec >= c.threshold then return 'consecutive' end
  if c.trip == 'count' and w.tf >= c.threshold then return 'count' end
  local least = least_calls(c, w)
  if c.trip == 'rate' and w.tc >= least and w.tf / w.tc >= c.rate then return 'rate' end
  if c.slow_ms > 0 and w.tc >= least and w.ts / w.tc >= c.slow_rate then return 'slow' end
  return nil
end

-- Open: the first trip for exactly open_seconds; a trip after a failed
-- half-open multiplies the last period by the backoff (capped) and adds up
-- to 10% jitter derived from the time and epoch, so breakers spread out.
-- The period after a failed probe: the last one (last_ms) times the backoff, capped, and
-- with up to 10% jitter (base, with jitter).
local function backed_off(c, last_ms, epoch)
  local base = math.min(math.floor(math.max(last_ms, c.open_ms) * c.backoff), c.max_open_ms)
  return base, base + math.floor(base * (((NOW % 997) * 31 + epoch * 17) % 100) / 1000)
end

local function trip_open(s, c, cause, after_half_open)
  local base, dur = c.open_ms, c.open_ms
  if after_half_open then
    base, dur = backed_off(c, s.open_ms, s.epoch)
    drop_probes()
  end
  s.open_ms, s.open_until, s.consec, s.ho_ok = base, NOW + dur, 0, 0
  transition(s, 'open', cause)
  stat('trips', 1)
end

-- c: the config, for the ramp (ramp.lua; nil: none): while it runs the backoff is kept.
local function close(s, cause, c)
  s.consec, s.ho_ok, s.open_until, s.ramp_until = 0, 0, 0, ramp_end(c)
  if s.ramp_until == 0 then s.open_ms = 0 end
  redis.call('DEL', K_WINDOW)
  drop_probes()
  give_back_grant(nil)  -- a member's grant: closed, it no longer needs one
  transition(s, 'closed', cause)
end
