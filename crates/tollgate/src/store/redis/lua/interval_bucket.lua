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

local function expires_at(t, w)
  local start = w[t.offset + 2]
  if start == 0 then return 0 end
  return start + t.period
end
