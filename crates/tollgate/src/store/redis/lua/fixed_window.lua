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

local function debit(t, w, a)
  local o, aligned = t.offset, a.now - a.now % t.period
  local start, count = aligned, 0
  if w[o + 1] >= aligned then start, count = w[o + 1], w[o + 2] end
  w[o + 1], w[o + 2] = start, min(count + a.cost, MAX_EXACT)
end

-- Only while the window of the credit is the one counted.
local function credit(t, w, a)
  local o, at = t.offset, a.credit_at
  if w[o + 1] == at - at % t.period then w[o + 2] = max(w[o + 2] - a.cost, 0) end
end

local function expires_at(t, w)
  return w[t.offset + 1] + t.period
end
