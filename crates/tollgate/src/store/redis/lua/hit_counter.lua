-- Hit counter (src/algorithm/hit_counter.rs). Words: window start, hits counted in it.

local function decide(t, w, a)
  local o, limit = t.offset, t.limit
  local start, finish, count = counted_window(t, w, a.now)
  local reset_after = finish - a.now
  local after = count + a.cost
  if after > 9007199254740991 then after = 9007199254740991 end
  if after <= limit then
    if a.writes then w[o + 1], w[o + 2] = start, after end
    return 1, limit, limit - after, reset_after, 0, 0
  end
  return deny(limit, 0, reset_after, reset_after)
end

-- A denied check counts its hits when this tier itself is over.
local function denied(t, w, a)
  local start, _, count = counted_window(t, w, a.now)
  local after = min(count + a.cost, 9007199254740991)
  if after > t.limit then w[t.offset + 1], w[t.offset + 2] = start, after end
end

local function debit(t, w, a)
  local start, _, count = counted_window(t, w, a.now)
  w[t.offset + 1], w[t.offset + 2] = start, min(count + a.cost, MAX_EXACT)
end

local function credit(t, w, a)
  local o, at = t.offset, a.credit_at
  if w[o + 1] == window_of(t, at) then w[o + 2] = max(w[o + 2] - a.cost, 0) end
end

local expires_at = counted_window_end
