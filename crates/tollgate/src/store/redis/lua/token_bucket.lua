-- Token bucket (src/algorithm/token_bucket.rs). Parameter p1: initial tokens, or -1 for a full
-- bucket. Words: tokens (rate units), time of the last admission (0 = never). A bucket with
-- fewer initial tokens than its burst expires once it has stayed full for a whole period; a
-- key whose every tier has expired is then read as a key never seen (`forgets`).

local function expires_at(t, w)
  local o = t.offset
  if w[o + 2] == 0 then return 0 end
  local full = w[o + 2] + micros(t, max(units(t, t.burst) - w[o + 1], 0))
  if t.p1 >= 0 and t.p1 < t.burst then return full + t.period end
  return full
end

local function forgets(tiers) return tiers[1].p1 >= 0 end

local function decide(t, w, a)
  local o, burst = t.offset, t.burst
  local capacity = units(t, burst)
  local tokens, last = w[o + 1], w[o + 2]
  if last == 0 then
    local initial = t.p1
    if initial < 0 then initial = burst end
    tokens = units(t, initial)
  else
    tokens = min(tokens + drained(t, max(a.now - last, 0)), capacity)
  end
  local allowed, limit, remaining, reset_after, retry_after =
    bucket(t, burst, capacity - tokens, a.cost)
  if allowed == 1 and a.writes then
    w[o + 1], w[o + 2] = tokens - units(t, a.cost), max(a.now, last)
  end
  return allowed, limit, remaining, reset_after, retry_after, 0
end

local function denied(t, w, a)
  local o = t.offset
  if t.p1 >= 0 and w[o + 2] == 0 then w[o + 1], w[o + 2] = units(t, t.p1), a.now end
end
