-- Concurrency (src/algorithm/concurrency.rs). Words: one per slot, when its lease ends (µs;
-- free from then on). A release frees, and a renewal renews, the slot whose lease ends first.

slots = true

-- Slots held at now, and the latest lease end (now when none is later).
local function held_at(t, w, now)
  local o, held, last = t.offset, 0, now
  for i = o + 1, o + t.limit do
    local ends = w[i]
    if ends > now then held = held + 1 end
    if ends > last then last = ends end
  end
  return held, last
end

-- Takes up to `count` free slots until `until`.
local function take(t, w, now, count, until_)
  local o = t.offset
  for i = o + 1, o + t.limit do
    if count <= 0 then return end
    if w[i] <= now then w[i], count = until_, count - 1 end
  end
end

-- Frees (until_ 0) or renews the `count` held slots whose leases end first.
local function earliest(t, w, now, count, until_)
  local o = t.offset
  for _ = 1, count do
    local first
    for i = o + 1, o + t.limit do
      if w[i] > now and (not first or w[i] < w[first]) then first = i end
    end
    if not first then return end
    w[first] = until_
  end
end

local function decide(t, w, a)
  local limit, now, cost = t.limit, a.now, a.cost
  local held, last = held_at(t, w, now)
  if held + cost <= limit then
    -- The verdict as if taken, written or not (as remaining is).
    if cost > 0 then
      local until_ = now + t.period
      if a.writes then take(t, w, now, cost, until_) end
      last = max(last, until_)
    end
    return allow(limit, limit - held - cost, last - now)
  end
  -- The (held + cost - limit)-th lease to end.
  local ends, o = {}, t.offset
  for i = o + 1, o + limit do
    if w[i] > now then ends[#ends + 1] = w[i] end
  end
  table.sort(ends)
  return deny(limit, limit - held, last - now, ends[held + cost - limit] - now)
end

local function denied(t, w, a) end

local function debit(t, w, a)
  take(t, w, a.now, a.cost, a.now + t.period)
end

local function credit(t, w, a)
  earliest(t, w, a.now, a.cost, 0)
end

local function renew(t, w, a)
  earliest(t, w, a.now, a.cost, a.now + t.period)
end

local function expires_at(t, w)
  local o, last = t.offset, 0
  for i = o + 1, o + t.limit do
    if w[i] > last then last = w[i] end
  end
  return last
end
