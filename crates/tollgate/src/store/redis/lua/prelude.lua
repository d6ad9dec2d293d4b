-- tollgate: every script is this prelude, one algorithm, then a driver (words.lua or log.lua).
-- It is one atomic step: nothing can expire or change between reading a key and writing it.
--
-- ARGV[1]  four little-endian doubles: now in microseconds since the Unix epoch (-1 to read
--          the server's TIME); the cost in permits (0 looks without consuming); the longest
--          delay the caller accepts from a shaper in µs (-1 for none); milliseconds added to
--          every TTL (0 on the server's time; more on the caller's, whose clock says when
--          state expires while Redis expires keys by its own)
-- ARGV[2]  eleven little-endian doubles per tier: limit, period (µs), burst, per_permit,
--          per_micro, state words, and five algorithm parameters
-- Returns six integers per tier, in order: allowed (1/0), limit, remaining, reset_after (µs),
-- retry_after (µs), delay (µs). The caller combines them.
--
-- Lua numbers are doubles. Rules are validated so that every integer here stays below 2^53:
-- the arithmetic is exact and follows src/algorithm operation for operation. Numbers given to
-- redis.call keep all their digits; tostring() does not, so it is never used on them. The
-- arguments come packed because unpacking two strings costs far less than converting sixteen.

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

-- The script's reply: every tier's verdict, in order.
local function reply(verdicts)
  if #verdicts == 1 then return verdicts[1] end
  local flat = {}
  for _, verdict in ipairs(verdicts) do
    for j = 1, 6 do flat[#flat + 1] = verdict[j] end
  end
  return flat
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

local now, cost, max_delay, ttl_padding = struct.unpack('<dddd', ARGV[1])
if now < 0 then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
now = max(now, 1)
if max_delay < 0 then max_delay = nil end
local attempt = {now = now, cost = cost, max_delay = max_delay, commit = true}
local tiers = {}
local offset = 0
local n = #ARGV[2] / 88
local v = {struct.unpack('<' .. string.rep('d', 11 * n), ARGV[2])}
for i = 1, n do
  local a = (i - 1) * 11
  local t = {
    limit = v[a + 1], period = v[a + 2], burst = v[a + 3], per_permit = v[a + 4],
    per_micro = v[a + 5], words = v[a + 6],
    p1 = v[a + 7], p2 = v[a + 8], p3 = v[a + 9], p4 = v[a + 10], p5 = v[a + 11],
    offset = offset,
  }
  offset = offset + t.words
  tiers[i] = t
end
