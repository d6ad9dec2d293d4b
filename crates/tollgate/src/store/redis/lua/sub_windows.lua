-- Sliding window of sub-windows (src/algorithm/sub_windows.rs). Parameter p1: the number of
-- sub-windows, which is the tier's words but one: the count is read from the words, so that
-- no caller's p1 makes a loop here longer than the state it reads. Words: index of the newest
-- sub-window written, then one count per sub-window, sub-window i at position i % count.

-- (max(), floor() and allow() written out here and in decide(): every check runs them, and a
-- call costs Redis more than the arithmetic.)
local function sum(w, o, count, newest, at)
  local total, oldest = 0, at + 1 - count
  if oldest < 0 then oldest = 0 end
  for i = oldest, newest do total = total + w[o + 2 + i % count] end
  return total
end

local function reset_at(w, o, count, newest, at, length)
  local oldest = at + 1 - count
  if oldest < 0 then oldest = 0 end
  for i = newest, oldest, -1 do
    if w[o + 2 + i % count] > 0 then return (i + count) * length end
  end
  return 0
end

local function decide(t, w, a)
  local o, limit, now, cost, count = t.offset, t.limit, a.now, a.cost, t.words - 1
  local length = t.period / count
  local newest = w[o + 1]
  local current = now / length
  current = current - current % 1
  if current < newest then current = newest end
  local used = sum(w, o, count, newest, current)
  local reset_after = reset_at(w, o, count, newest, current, length) - now
  if reset_after < 0 then reset_after = 0 end
  if used + cost > limit then
    -- The window's count as its oldest sub-windows leave it, one at a time: one pass.
    local next_at, total = nil, used
    for at = current + 1, current + count do
      local left = at - count
      if left >= 0 and left <= newest then total = total - w[o + 2 + left % count] end
      if total + cost <= limit then next_at = at; break end
    end
    return deny(limit, max(limit - used, 0), reset_after, next_at * length - now)
  end
  if a.writes then
    local first = newest + 1
    if first < current - (count - 1) then first = current - (count - 1) end
    if first < 0 then first = 0 end
    for i = first, current do w[o + 2 + i % count] = 0 end
    w[o + 2 + current % count] = w[o + 2 + current % count] + cost
    w[o + 1] = current
  end
  if cost > 0 then reset_after = (current + count) * length - now end
  return 1, limit, limit - used - cost, reset_after, 0, 0
end

local function denied(t, w, a) end

local function debit(t, w, a)
  local o, count = t.offset, t.words - 1
  local newest = w[o + 1]
  local current = max(floor(a.now / (t.period / count)), newest)
  for i = max(newest + 1, current - (count - 1), 0), current do w[o + 2 + i % count] = 0 end
  local s = o + 2 + current % count
  w[s] = min(w[s] + a.cost, MAX_EXACT)
  w[o + 1] = current
end

-- Only a sub-window still held: not overwritten by a later one in its slot.
local function credit(t, w, a)
  local o, count = t.offset, t.words - 1
  local index = floor(a.credit_at / (t.period / count))
  local newest = w[o + 1]
  if index <= newest and newest - index < count then
    local s = o + 2 + index % count
    w[s] = max(w[s] - a.cost, 0)
  end
end

local function expires_at(t, w)
  local count = t.words - 1
  return (w[t.offset + 1] + count) * (t.period / count)
end
