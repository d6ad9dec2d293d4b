-- tollgate: every script is this prelude, one algorithm, then a driver (words.lua or log.lua).
-- It is one atomic step: nothing can expire or change between reading a key and writing it.
--
-- ARGV[1]  now, in microseconds since the Unix epoch; empty to read the server's TIME
-- ARGV[2]  cost (permits); 0 looks without consuming
-- ARGV[3]  the longest delay the caller accepts from a shaper (µs); empty for none
-- ARGV[4]  milliseconds added to every TTL: 0 when now is the server's time; more when it
--          is the caller's, whose clock says when state expires while Redis expires keys by
--          its own
-- ARGV[5]  the number of tiers, then for each tier eleven values: limit, period (µs), burst,
--          per_permit, per_micro, state words, and five algorithm parameters
-- Returns six integers per tier, in order: allowed (1/0), limit, remaining, reset_after (µs),
-- retry_after (µs), delay (µs). The caller combines them.
--
-- Lua numbers are doubles. Rules are validated so that every integer here stays below 2^53:
-- the arithmetic is exact and follows src/algorithm operation for operation. Numbers given to
-- redis.call keep all their digits; tostring() does not, so it is never used on them.

local floor, ceil, min, max = math.floor, math.ceil, math.min, math.max

local function ceil_div(a, b)
  return floor((a + b - 1) / b)
end

local function allow(limit, remaining, reset_after)
  return {1, limit, remaining, reset_after, 0, 0}
end

local function deny(limit, remaining, reset_after, retry_after)
  return {0, limit, remaining, reset_after, max(retry_after, 1), 0}
end

local function writes(attempt)
  return attempt.commit and attempt.cost > 0
end

-- Exact rates (src/algorithm/rate.rs): a permit is per_permit units, a microsecond per_micro.
local function units(t, permits) return permits * t.per_permit end
local function permits(t, u) return floor(u / t.per_permit) end
local function micros(t, u) return ceil_div(u, t.per_micro) end
local function drained(t, elapsed) return elapsed * t.per_micro end

local function bucket(t, burst, level, cost)
  local capacity = units(t, burst)
  local after = level + units(t, cost)
  if after <= capacity then
    return allow(burst, permits(t, capacity - after), micros(t, after))
  end
  return deny(burst, permits(t, max(capacity - level, 0)), micros(t, level),
    micros(t, after - capacity))
end

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
now = max(now, 1)
local attempt = {now = now, cost = tonumber(ARGV[2]), max_delay = tonumber(ARGV[3]), commit = true}
local ttl_padding = tonumber(ARGV[4])
local tiers = {}
local offset = 0
for i = 1, tonumber(ARGV[5]) do
  local a = 5 + (i - 1) * 11
  local t = {
    limit = tonumber(ARGV[a + 1]), period = tonumber(ARGV[a + 2]), burst = tonumber(ARGV[a + 3]),
    per_permit = tonumber(ARGV[a + 4]), per_micro = tonumber(ARGV[a + 5]),
    words = tonumber(ARGV[a + 6]),
    p1 = tonumber(ARGV[a + 7]), p2 = tonumber(ARGV[a + 8]), p3 = tonumber(ARGV[a + 9]),
    p4 = tonumber(ARGV[a + 10]), p5 = tonumber(ARGV[a + 11]),
    offset = offset, index = i,
  }
  offset = offset + t.words
  tiers[i] = t
end
