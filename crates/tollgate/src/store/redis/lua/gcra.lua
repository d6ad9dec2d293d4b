-- GCRA (src/algorithm/gcra.rs). Words: theoretical arrival time (µs), and its fraction in
-- 1/per_micro µs when the tier has a second word.

local function decide(t, w, a)
  local o, n, now = t.offset, t.per_micro, a.now
  local tat, fraction = w[o + 1], 0
  -- A fraction kept under an earlier rate of this rule counts as under a microsecond (min()
  -- written out: every check runs it).
  if t.words > 1 then
    fraction = w[o + 2]
    if fraction > n - 1 then fraction = n - 1 end
  end
  if tat < now then tat, fraction = now, 0 end
  local allowed, limit, remaining, reset_after, retry_after =
    bucket(t, t.burst, (tat - now) * n + fraction, a.cost)
  if allowed == 1 and a.writes then
    -- units() and floor() written out: every admitted check runs them.
    local ticks = fraction + a.cost * t.per_permit
    local whole = ticks / n
    w[o + 1] = tat + (whole - whole % 1)
    if t.words > 1 then w[o + 2] = ticks % n end
  end
  return allowed, limit, remaining, reset_after, retry_after, 0
end

local function denied(t, w, a) end

-- The bucket's level at `now` in units, and its schedule written back from a level.
local function level_at(t, w, now)
  local o, n = t.offset, t.per_micro
  local tat, fraction = w[o + 1], 0
  if t.words > 1 then fraction = min(w[o + 2], n - 1) end
  if tat < now then tat, fraction = now, 0 end
  return (tat - now) * n + fraction
end

local function set_level(t, w, now, level)
  local o, n = t.offset, t.per_micro
  w[o + 1] = now + floor(level / n)
  if t.words > 1 then w[o + 2] = level % n end
end

local function debit(t, w, a)
  set_level(t, w, a.now, min(level_at(t, w, a.now) + units(t, a.cost), MAX_EXACT))
end

local function credit(t, w, a)
  set_level(t, w, a.now, max(level_at(t, w, a.now) - units(t, a.cost), 0))
end

local function expires_at(t, w)
  local o = t.offset
  if t.words > 1 and w[o + 2] > 0 then return w[o + 1] + 1 end
  return w[o + 1]
end
