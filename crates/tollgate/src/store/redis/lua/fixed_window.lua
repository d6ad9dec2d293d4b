-- Fixed window (src/algorithm/fixed_window.rs). Words: window start, count.

local function decide(t, w, a)
  local o, limit, period = t.offset, t.limit, t.period
  local aligned = a.now - a.now % period
  local start, count = aligned, 0
  if w[o + 1] >= aligned then start, count = w[o + 1], w[o + 2] end
  local reset_after = start + period - a.now
  local after = count + a.cost
  if after <= limit then
    if a.writes then w[o + 1], w[o + 2] = start, after end
    return allow(limit, limit - after, reset_after)
  end
  return deny(limit, max(limit - count, 0), reset_after, reset_after)
end

local function denied(t, w, a) end

local function expires_at(t, w)
  return w[t.offset + 1] + t.period
end
