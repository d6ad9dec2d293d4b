-- Fixed window (src/algorithm/fixed_window.rs). Words: window start, count.

local function decide(t, w, a)
  local o, limit = t.offset, t.limit
  local start, finish, count = counted_window(t, w, a.now)
  local reset_after = finish - a.now
  local after = count + a.cost
  if after <= limit then
    if a.writes then w[o + 1], w[o + 2] = start, after end
    return 1, limit, limit - after, reset_after, 0, 0
  end
  return deny(limit, max(limit - count, 0), reset_after, reset_after)
end

local function denied(t, w, a) end

local function debit(t, w, a)
  local o = t.offset
  local start, _, count = counted_window(t, w, a.now)
  w[o + 1], w[o + 2] = start, min(count + a.cost, MAX_EXACT)
end

-- Only while the window of the credit is the one counted.
local function credit(t, w, a)
  local o = t.offset
  if w[o + 1] == window_of(t, a.credit_at) then w[o + 2] = max(w[o + 2] - a.cost, 0) end
end

local expires_at = counted_window_end
