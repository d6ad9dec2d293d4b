-- Sliding window counter (src/algorithm/sliding_window.rs). Words: current window start,
-- previous window's count, current window's count. The estimate is computed in the same order
-- of operations as the Rust code.

-- The windows at `at`: the current window's start, the previous window's count and the
-- current window's count (three values, not a table: every check runs this).
local function windows(t, w, at)
  local o, period = t.offset, t.period
  local aligned = at - at % period
  local s = w[o + 1]
  if s >= aligned then return s, w[o + 2], w[o + 3] end
  if s + period == aligned then return aligned, w[o + 3], 0 end
  return aligned, 0, 0
end

local function estimate(start, previous, current, period, at)
  local elapsed = max(at - start, 0)
  if elapsed < period then
    return previous * ((period - elapsed) / period) + current
  elseif elapsed < 2 * period then
    return current * ((period - (elapsed - period)) / period)
  end
  return 0
end

local function earliest(start, previous, current, period, cost, limit)
  -- No time admits a cost above the limit, and the steps below would never end: refused, as
  -- the library refuses it before calling (this is for callers of the function but the library).
  if cost > limit then error('tollgate: a cost above the limit') end
  local room = limit - current - cost
  local at
  if room >= 0 then
    at = start + period - floor(room * period / previous)
  else
    room = limit - cost
    at = start + 2 * period - floor(room * period / current)
  end
  -- (Past 2^53, where at + 1 is at, only a caller's absurd times or periods go: it stops.)
  while estimate(start, previous, current, period, at) + cost > limit and at + 1 > at do
    at = at + 1
  end
  return at
end

local function reset_at(start, previous, current, period)
  if current > 0 then return start + 2 * period end
  if previous > 0 then return start + period end
  return 0
end

-- max() and floor() written out: every admitted check runs this.
local function remaining(limit, estimated)
  local left = limit - estimated
  left = left - left % 1
  if left < 0 then return 0 end
  return left
end

local function decide(t, w, a)
  local o, limit, period, now, cost = t.offset, t.limit, t.period, a.now, a.cost
  local start, previous, current = windows(t, w, now)
  -- As estimate() at now, which is in the current window (or before a later one): the
  -- previous window's weight worked out once for both estimates.
  local elapsed = now - start
  if elapsed < 0 then elapsed = 0 end
  local weighted = previous * ((period - elapsed) / period)
  if weighted + current + cost <= limit then
    current = current + cost
    if a.writes then w[o + 1], w[o + 2], w[o + 3] = start, previous, current end
    -- max() and allow() written out: every admitted check runs them.
    local reset_after = reset_at(start, previous, current, period) - now
    if reset_after < 0 then reset_after = 0 end
    return 1, limit, remaining(limit, weighted + current), reset_after, 0, 0
  end
  return deny(limit, remaining(limit, weighted + current),
    max(reset_at(start, previous, current, period) - now, 0),
    earliest(start, previous, current, period, cost, limit) - now)
end

local function denied(t, w, a) end

local function debit(t, w, a)
  local o = t.offset
  local start, previous, current = windows(t, w, a.now)
  w[o + 1], w[o + 2], w[o + 3] = start, previous, min(current + a.cost, MAX_EXACT)
end

-- In the current window, or the previous one while it still weighs.
local function credit(t, w, a)
  local o, period, at = t.offset, t.period, a.credit_at
  local start, previous, current = windows(t, w, a.now)
  local window = at - at % period
  if window == start then
    current = max(current - a.cost, 0)
  elseif window + period == start then
    previous = max(previous - a.cost, 0)
  else
    return
  end
  w[o + 1], w[o + 2], w[o + 3] = start, previous, current
end

-- The stored windows' reset: windows() of a stored start is the stored words themselves.
local function expires_at(t, w)
  local o = t.offset
  return reset_at(w[o + 1], w[o + 2], w[o + 3], t.period)
end
