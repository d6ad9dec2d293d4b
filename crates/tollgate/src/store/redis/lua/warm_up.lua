-- Warm-up after Guava's SmoothWarmingUp (src/algorithm/warm_up.rs). Parameters, computed by
-- the Rust code so that both use the same doubles: p1 stable interval (µs), p2 threshold, p3
-- maximum stored permits, p4 slope, p5 cool-down (µs per stored permit). Words: stored
-- permits, next free time (0 = never seen).

local function ramp_cost(t, stored, take)
  local above = stored - t.p2
  local spent = 0
  if above > 0 then
    local ramp = min(above, take)
    spent = ramp * ((t.p1 + above * t.p4) + (t.p1 + (above - ramp) * t.p4)) / 2
    take = take - ramp
  end
  return spent + t.p1 * take
end

-- The permits stored and the next free time at `now`.
local function at_now(t, w, now)
  local o = t.offset
  local stored, next_free = w[o + 1], w[o + 2]
  if next_free == 0 then
    return t.p3, now
  elseif now > next_free then
    return min(stored + (now - next_free) / t.p5, t.p3), now
  end
  return stored, next_free
end

local function decide(t, w, a)
  local o, limit, now, cost = t.offset, t.limit, a.now, a.cost
  local stored, next_free = at_now(t, w, now)
  local delay = next_free - now
  local patience = a.max_delay or 0
  if delay > patience then return deny(limit, 0, delay, delay - patience) end
  -- min() and ceil() written out: every check runs them.
  local spent = stored
  if cost < spent then spent = cost end
  local wait = ramp_cost(t, stored, spent) + (cost - spent) * t.p1
  local whole = wait - wait % 1
  if whole < wait then whole = whole + 1 end
  local next_after = next_free + whole
  if a.writes then w[o + 1], w[o + 2] = stored - spent, next_after end
  local remaining = 0
  if next_after <= now then remaining = limit end
  return 1, limit, remaining, next_after - now, 0, delay
end

local function denied(t, w, a) end

local function debit(t, w, a)
  local o = t.offset
  local stored, next_free = at_now(t, w, a.now)
  local spent = min(a.cost, stored)
  local wait = ramp_cost(t, stored, spent) + (a.cost - spent) * t.p1
  w[o + 1], w[o + 2] = stored - spent, min(next_free + ceil(wait), MAX_EXACT)
end

-- Warm-up keeps what it took.
local function credit(t, w, a) end

local function expires_at(t, w)
  local o = t.offset
  if w[o + 2] == 0 then return 0 end
  -- ceil() written out: every check runs this twice.
  local cool = (t.p3 - w[o + 1]) * t.p5
  local whole = cool - cool % 1
  if whole < cool then whole = whole + 1 end
  return w[o + 2] + whole + 1
end
