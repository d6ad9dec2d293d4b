-- Fixed window (src/algorithm/fixed_window.rs). Words: window start, count.

-- The window of now: its start, its end and its count; a count from a later window (written
-- by a clock ahead of this one) keeps counting, until that window's end.
local function window(t, w, now)
  local o = t.offset
  local start, finish
  if t.p5 ~= 1 then
    -- window_of's aligned window written out: every check asks for it.
    local period = t.period
    start = now - now % period
    finish = start + period
  else
    start, finish = window_of(t, now)
  end
  local written = w[o + 1]
  if written == start then return start, finish, w[o + 2] end
  if written > start then
    local _, later = window_of(t, written)
    return written, later, w[o + 2]
  end
  return start, finish, 0
end

local function decide(t, w, a)
  local o, limit = t.offset, t.limit
  local start, finish, count = window(t, w, a.now)
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
  local start, _, count = window(t, w, a.now)
  w[o + 1], w[o + 2] = start, min(count + a.cost, MAX_EXACT)
end

-- Only while the window of the credit is the one counted.
local function credit(t, w, a)
  local o = t.offset
  if w[o + 1] == window_of(t, a.credit_at) then w[o + 2] = max(w[o + 2] - a.cost, 0) end
end

local function expires_at(t, w)
  local start = w[t.offset + 1]
  if t.p5 ~= 1 then return start - start % t.period + t.period end
  local _, finish = window_of(t, start)
  return finish
end
