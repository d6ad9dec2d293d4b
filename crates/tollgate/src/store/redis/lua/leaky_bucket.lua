-- Leaky bucket as a meter or a shaper (src/algorithm/leaky_bucket.rs). Parameter p1: 1 for a
-- shaper. Words: water level (rate units), time of the last admission.

local function decide(t, w, a)
  local o, last, now = t.offset, w[t.offset + 2], a.now
  -- drained(), min() and max() written out: every check runs them.
  local elapsed = now - last
  if elapsed < 0 then elapsed = 0 end
  local level = w[o + 1] - elapsed * t.per_micro
  if level < 0 then level = 0 end
  local allowed, limit, remaining, reset_after, retry_after = bucket(t, t.burst, level, a.cost)
  local delay = 0
  if t.p1 == 1 and allowed == 1 then
    delay = micros(t, level)
    if a.max_delay and delay > a.max_delay then
      return deny(limit, remaining, delay, delay - a.max_delay)
    end
  end
  if allowed == 1 and a.writes then
    if last > now then now = last end
    w[o + 1], w[o + 2] = level + a.cost * t.per_permit, now
  end
  return allowed, limit, remaining, reset_after, retry_after, delay
end

local function denied(t, w, a) end

local function debit(t, w, a)
  local o, last = t.offset, w[t.offset + 2]
  local level = max(w[o + 1] - drained(t, max(a.now - last, 0)), 0)
  w[o + 1], w[o + 2] = min(level + units(t, a.cost), MAX_EXACT), max(a.now, last)
end

local function credit(t, w, a)
  local o, last = t.offset, w[t.offset + 2]
  local level = max(w[o + 1] - drained(t, max(a.now - last, 0)), 0)
  w[o + 1], w[o + 2] = max(level - units(t, a.cost), 0), max(a.now, last)
end

-- micros() written out: every check runs this twice.
local function expires_at(t, w)
  local o, per_micro = t.offset, t.per_micro
  local ticks = (w[o + 1] + per_micro - 1) / per_micro
  return w[o + 2] + (ticks - ticks % 1)
end
