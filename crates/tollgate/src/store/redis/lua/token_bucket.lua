-- Token bucket (src/algorithm/token_bucket.rs). Parameter p1: initial tokens, or -1 for a full
-- bucket. Words: tokens (rate units), time of the last admission (0 = never); a key in debt
-- has no tokens and its last admission in the future. A bucket with fewer initial tokens than
-- its burst expires once it has stayed full for a whole period; a key whose every tier has
-- expired is then read as a key never seen (`forgets`).

-- (units(), micros(), min(), max() and floor() written out here and in refilled() and
-- decide(): every check runs them, and a call costs Redis more than the arithmetic.)
local function expires_at(t, w)
  local o = t.offset
  local last = w[o + 2]
  if last == 0 then return 0 end
  local per_micro = t.per_micro
  local missing = t.burst * t.per_permit - w[o + 1]
  if missing < 0 then missing = 0 end
  local ticks = (missing + per_micro - 1) / per_micro
  local full = last + (ticks - ticks % 1)
  if t.p1 >= 0 and t.p1 < t.burst then return full + t.period end
  return full
end

local function forgets(tiers) return tiers[1].p1 >= 0 end

-- The tokens at `now` and the time of the last admission.
local function refilled(t, w, now)
  local o = t.offset
  local tokens, last = w[o + 1], w[o + 2]
  if last == 0 then
    local initial = t.p1
    if initial < 0 then initial = t.burst end
    return units(t, initial), 0
  end
  -- min() and max() written out: every check runs them.
  local elapsed, capacity = now - last, t.burst * t.per_permit
  if elapsed < 0 then elapsed = 0 end
  tokens = tokens + elapsed * t.per_micro
  if tokens > capacity then tokens = capacity end
  return tokens, last
end

local function decide(t, w, a)
  local o, burst, now, cost = t.offset, t.burst, a.now, a.cost
  local tokens, last = refilled(t, w, now)
  local debt = 0
  if last > now then debt = (last - now) * t.per_micro end
  local allowed, limit, remaining, reset_after, retry_after =
    bucket(t, burst, burst * t.per_permit - tokens + debt, cost)
  if allowed == 1 and a.writes then
    if last > now then now = last end
    w[o + 1], w[o + 2] = tokens - cost * t.per_permit, now
  end
  return allowed, limit, remaining, reset_after, retry_after, 0
end

local function debit(t, w, a)
  local o, now = t.offset, a.now
  local tokens, last = refilled(t, w, now)
  local need = units(t, a.cost)
  if tokens >= need then
    w[o + 1], w[o + 2] = tokens - need, max(now, last)
  else
    local owed = min(drained(t, max(last - now, 0)) + need - tokens,
      MAX_EXACT - units(t, t.burst))
    w[o + 1], w[o + 2] = 0, now + micros(t, owed)
  end
end

local function credit(t, w, a)
  local o, now = t.offset, a.now
  local tokens, last = refilled(t, w, now)
  local give, capacity = units(t, a.cost), units(t, t.burst)
  if last > now then
    local owed = last - now
    local back = floor(give / t.per_micro)
    if back < owed then
      w[o + 2] = last - back
      return
    end
    w[o + 1], w[o + 2] = min(give - owed * t.per_micro, capacity), now
  else
    w[o + 1], w[o + 2] = min(tokens + give, capacity), max(now, last)
  end
end

local function denied(t, w, a)
  local o = t.offset
  if t.p1 >= 0 and w[o + 2] == 0 then w[o + 1], w[o + 2] = units(t, t.p1), a.now end
end
