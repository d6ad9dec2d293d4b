-- Hit counter (src/algorithm/hit_counter.rs). Words: window start, hits counted in it.

local function window(t, w, now)
  local aligned = now - now % t.period
  if w[t.offset + 1] >= aligned then return w[t.offset + 1], w[t.offset + 2] end
  return aligned, 0
end

local function decide(t, w, a)
  local o, limit = t.offset, t.limit
  local start, count = window(t, w, a.now)
  local reset_after = start + t.period - a.now
  local after = min(count + a.cost, 9007199254740991)
  if after <= limit then
    if a.writes then w[o + 1], w[o + 2] = start, after end
    return allow(limit, limit - after, reset_after)
  end
  return deny(limit, 0, reset_after, reset_after)
end

-- A denied check counts its hits when this tier itself is over.
local function denied(t, w, a)
  local start, count = window(t, w, a.now)
  local after = min(count + a.cost, 9007199254740991)
  if after > t.limit then w[t.offset + 1], w[t.offset + 2] = start, after end
end

local function debit(t, w, a)
  local start, count = window(t, w, a.now)
  w[t.offset + 1], w[t.offset + 2] = start, min(count + a.cost, MAX_EXACT)
end

local function credit(t, w, a)
  local o, at = t.offset, a.credit_at
  if w[o + 1] == at - at % t.period then w[o + 2] = max(w[o + 2] - a.cost, 0) end
end

local function expires_at(t, w)
  return w[t.offset + 1] + t.period
end
