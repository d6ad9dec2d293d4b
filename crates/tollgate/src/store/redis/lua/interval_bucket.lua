-- Interval-refill bucket (src/algorithm/interval_bucket.rs). Words: permits used in the
-- current period, its start (0 = none).

local function decide(t, w, a)
  local o, limit, period, now = t.offset, t.limit, t.period, a.now
  local used, start = w[o + 1], w[o + 2]
  local running = start ~= 0 and now < start + period
  if not running then used, start = 0, now end
  local after = used + a.cost
  if after > limit then
    local wait = start + period - now
    return deny(limit, max(limit - used, 0), wait, wait)
  end
  if a.writes then w[o + 1], w[o + 2] = after, start end
  local reset_after = 0
  if running or a.cost > 0 then reset_after = start + period - now end
  return allow(limit, limit - after, reset_after)
end

local function denied(t, w, a) end

local function debit(t, w, a)
  local o = t.offset
  local used, start = w[o + 1], w[o + 2]
  if not (start ~= 0 and a.now < start + t.period) then used, start = 0, a.now end
  w[o + 1], w[o + 2] = min(used + a.cost, MAX_EXACT), start
end

-- Only within the period the credit was taken in; a period with nothing left taken in it is
-- as if it never started.
local function credit(t, w, a)
  local o = t.offset
  local start = w[o + 2]
  if start ~= 0 and a.credit_at >= start and a.now < start + t.period then
    w[o + 1] = max(w[o + 1] - a.cost, 0)
    if w[o + 1] == 0 then w[o + 2] = 0 end
  end
end

local function expires_at(t, w)
  local start = w[t.offset + 2]
  if start == 0 then return 0 end
  return start + t.period
end
