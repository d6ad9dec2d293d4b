-- Sliding window counter (src/algorithm/sliding_window.rs). Words: current window start,
-- previous window's count, current window's count. The estimate is computed in the same order
-- of operations as the Rust code.

local function windows(t, w, at)
  local o, period = t.offset, t.period
  local aligned = at - at % period
  local s = w[o + 1]
  if s >= aligned then return {start = s, previous = w[o + 2], current = w[o + 3]} end
  if s + period == aligned then return {start = aligned, previous = w[o + 3], current = 0} end
  return {start = aligned, previous = 0, current = 0}
end

local function estimate(win, period, at)
  local elapsed = max(at - win.start, 0)
  if elapsed < period then
    return win.previous * ((period - elapsed) / period) + win.current
  elseif elapsed < 2 * period then
    return win.current * ((period - (elapsed - period)) / period)
  end
  return 0
end

local function earliest(win, period, cost, limit)
  local room = limit - win.current - cost
  local at
  if room >= 0 then
    at = win.start + period - floor(room * period / win.previous)
  else
    room = limit - cost
    at = win.start + 2 * period - floor(room * period / win.current)
  end
  while estimate(win, period, at) + cost > limit do at = at + 1 end
  return at
end

local function reset_at(win, period)
  if win.current > 0 then return win.start + 2 * period end
  if win.previous > 0 then return win.start + period end
  return 0
end

local function remaining(limit, estimated)
  return max(floor(limit - estimated), 0)
end

local function decide(t, w, a)
  local o, limit, period, now = t.offset, t.limit, t.period, a.now
  local win = windows(t, w, now)
  if estimate(win, period, now) + a.cost <= limit then
    win.current = win.current + a.cost
    if a.writes then w[o + 1], w[o + 2], w[o + 3] = win.start, win.previous, win.current end
    return allow(limit, remaining(limit, estimate(win, period, now)),
      max(reset_at(win, period) - now, 0))
  end
  return deny(limit, remaining(limit, estimate(win, period, now)),
    max(reset_at(win, period) - now, 0), earliest(win, period, a.cost, limit) - now)
end

local function denied(t, w, a) end

local function debit(t, w, a)
  local o = t.offset
  local win = windows(t, w, a.now)
  w[o + 1], w[o + 2], w[o + 3] = win.start, win.previous, min(win.current + a.cost, MAX_EXACT)
end

-- In the current window, or the previous one while it still weighs.
local function credit(t, w, a)
  local o, period, at = t.offset, t.period, a.credit_at
  local win = windows(t, w, a.now)
  local window = at - at % period
  if window == win.start then
    win.current = max(win.current - a.cost, 0)
  elseif window + period == win.start then
    win.previous = max(win.previous - a.cost, 0)
  else
    return
  end
  w[o + 1], w[o + 2], w[o + 3] = win.start, win.previous, win.current
end

local function expires_at(t, w)
  return reset_at(windows(t, w, w[t.offset + 1]), t.period)
end
