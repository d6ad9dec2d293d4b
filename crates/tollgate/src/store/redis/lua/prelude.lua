-- tollgate's Redis functions: this prelude, the two drivers (words.lua, log.lua), then each
-- algorithm, registered as one function per algorithm in one library (script.rs assembles
-- it; on servers without functions, one EVAL script per algorithm instead). A call is one
-- atomic step: nothing can expire or change between reading a key and writing it.
--
-- args[1]  the header (HEADER_FORMAT): now in µs since the Unix epoch (-1 to read the
--          server's TIME), the cost in permits (0 looks), the longest delay accepted from a
--          shaper (µs, -1 for none), ms added to every TTL, what a settlement does
--          (SETTLE_*: a report takes the cost whatever the state, a credit gives back the cost
--          taken at credit_at, a renewal renews slots held), credit_at (µs)
-- args[2]  each tier's arguments (TIER_FORMAT): limit, period (µs), burst, per_permit,
--          per_micro, state words, and five algorithm parameters
-- Returns one string of VERDICT_DOUBLES little-endian doubles per tier, in order: allowed
-- (1/0), limit, remaining, reset_after (µs), retry_after (µs), delay (µs).
-- The names in capitals are layout.lua's, written from src/layout.rs, where each is defined.
--
-- Lua numbers are doubles. Rules are validated so that every integer here stays below 2^53:
-- the arithmetic is exact and follows src/algorithm operation for operation. Numbers given to
-- redis.call keep all their digits; tostring() does not, so it is never used on them.
--
-- Every check runs this, and Lua in Redis pays for each table, closure and call, so a check
-- allocates little: a tier's verdict is six return values, arguments, state and reply travel
-- as packed doubles, and a library keeps its parsed tiers (per args[2]) between calls.

-- Redis 7.0 loads a library without the standard libraries, so they are bound at first call.
local floor, ceil, min, max, pack, unpack_packed, unpack, rep, call
local function bind()
  floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
  pack, unpack_packed, unpack, rep, call = struct.pack, struct.unpack, _G.unpack, string.rep,
    redis.call
end

-- An integer as Redis reads it, every digit kept, formatted as an integer (cheaper than the
-- %.17g Redis applies to numbers given to redis.call). Kept by value: under load, checks of
-- one millisecond write the same TTLs. Bounded: cleared when full.
local decimals, decimals_count = {}, 0
local function decimal(x)
  local text = decimals[x]
  if text then return text end
  text = string.format('%d', x)
  if decimals_count >= 1000 then decimals, decimals_count = {}, 0 end
  decimals[x], decimals_count = text, decimals_count + 1
  return text
end

local function ceil_div(a, b)
  return floor((a + b - 1) / b)
end

local function allow(limit, remaining, reset_after)
  return 1, limit, remaining, reset_after, 0, 0
end

local function deny(limit, remaining, reset_after, retry_after)
  return 0, limit, remaining, reset_after, max(retry_after, 1), 0
end

-- Exact rates (src/algorithm/rate.rs): a permit is per_permit units, a microsecond per_micro.
local function units(t, permits) return permits * t.per_permit end
local function micros(t, u) return ceil_div(u, t.per_micro) end
local function drained(t, elapsed) return elapsed * t.per_micro end

-- The verdict of a bucket holding `level` units of `burst` permits, asked for `cost` permits:
-- units() and micros() written out, and the permits left (floor(u / per_permit)), as this is
-- the hottest path; floor(x) as x - x % 1 (the same double, without a call).
local function bucket(t, burst, level, cost)
  local per_permit, per_micro = t.per_permit, t.per_micro
  local capacity = burst * per_permit
  local after = level + cost * per_permit
  if after <= capacity then
    local remaining, reset_after = (capacity - after) / per_permit,
      (after + per_micro - 1) / per_micro
    return 1, burst, remaining - remaining % 1, reset_after - reset_after % 1, 0, 0
  end
  return deny(burst, floor(max(capacity - level, 0) / per_permit), ceil_div(level, per_micro),
    ceil_div(after - capacity, per_micro))
end

-- The window holding `now` of tier t: aligned to multiples of its period, or, for a calendar
-- period (p5 = 1), the one among the boundaries the caller computed around its own clock
-- (p1..p4: the starts of the window before, of the window and of the next, and the end of the
-- next), which a server's clock a moment apart from the caller's finds as well.
local function window_of(t, now)
  if t.p5 ~= 1 then
    local start = now - now % t.period
    return start, start + t.period
  end
  if now < t.p2 then return t.p1, t.p2 end
  if now < t.p3 then return t.p2, t.p3 end
  return t.p3, t.p4
end

-- The window of now of a tier whose words are a window's start and the count in it (the
-- fixed window's, the hit counter's): its start, its end and its count; a count from a later
-- window (written by a clock ahead of this one) keeps counting, until that window's end.
local function counted_window(t, w, now)
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

-- When the words `w` of such a tier are as good as new: the end of their window.
local function counted_window_end(t, w)
  local start = w[t.offset + 1]
  if t.p5 ~= 1 then return start - start % t.period + t.period end
  local _, finish = window_of(t, start)
  return finish
end

-- The format of `n` little-endian doubles, made once per count.
local formats = {}
local function doubles(n)
  local format = formats[n]
  if not format then
    format = '<' .. rep('d', n)
    formats[n] = format
  end
  return format
end

-- The largest integer a double holds exactly (2^53 - 1): settled quantities stop there.
local MAX_EXACT = 9007199254740991

-- Each algorithm's functions by its index (script.rs), for batches of several algorithms:
-- decide, debit and credit, and for word states denied and expires_at; `log` for the
-- sliding log.
local algorithms = {}

-- Parsed tiers by their packed arguments: a rule's never change. Bounded: cleared when full.
local parsed, parsed_count = {}, 0

-- The tiers of args[2]: each with its parameters and the position of its state words; the
-- list also has `words`, the state words of all tiers, the formats of state and reply, the
-- state of a key never seen, and `one`, its only tier (false if it has several: as an
-- expiry is a number, `one and expires_at(one, w) or latest(...)` finds one without a call).
local function tiers_of(packed)
  local tiers = parsed[packed]
  if tiers then return tiers end
  tiers = {}
  local words, position = 0, 1
  for i = 1, #packed / TIER_BYTES do
    local limit, period, burst, per_permit, per_micro, n, p1, p2, p3, p4, p5, next =
      unpack_packed(TIER_FORMAT, packed, position)
    -- A rule's state is at most 2^20 words (rule.rs: MAX_WORDS); more, from a caller other
    -- than the library, would keep Redis busy making its format. Once per tier argument.
    if not (n >= 0 and n % 1 == 0 and words + n <= 1048576) then
      error('tollgate: tier arguments no rule has')
    end
    tiers[i] = {
      limit = limit, period = period, burst = burst, per_permit = per_permit,
      per_micro = per_micro, words = n, p1 = p1, p2 = p2, p3 = p3, p4 = p4, p5 = p5,
      offset = words,
    }
    words, position = words + n, next
  end
  tiers.words = words
  tiers.one = #tiers == 1 and tiers[1]
  tiers.state_format = '<' .. rep('d', words)
  tiers.zero_state = rep('\0', 8 * words)
  tiers.reply_format = '<' .. rep('d', VERDICT_DOUBLES * #tiers)
  if parsed_count >= 1000 then parsed, parsed_count = {}, 0 end
  parsed[packed], parsed_count = tiers, parsed_count + 1
  return tiers
end

-- The check of args[1]: now, cost, max_delay (nil for none), ttl_padding, and writes (whether
-- an admitted cost is written: the drivers ask several tiers first without writing). Kept by
-- its packed argument, which on the server's time is the same for every check of a cost: only
-- now, cost (a batch's items set their own) and writes change, set again at each call, and the
-- library runs one call at a time.
local attempts, attempts_count = {}, 0
-- The seconds of the last TIME as Redis wrote them, and as microseconds: converted from text
-- once a second, not at every call.
local time_seconds, time_micros
local function attempt_of(packed)
  local a = attempts[packed]
  if not a then
    if not floor then bind() end
    local now, cost, max_delay, ttl_padding, settle, credit_at =
      unpack_packed(HEADER_FORMAT, packed)
    -- Times and costs below 2^53, as the library sends: a time of 1e300 from another caller
    -- made loops whose step no longer moved it (x + 1 == x) run for good.
    if not (now < MAX_EXACT and cost >= 0 and cost <= MAX_EXACT and max_delay < MAX_EXACT
        and ttl_padding >= 0 and ttl_padding < MAX_EXACT) then
      error('tollgate: a check argument no library call has')
    end
    if max_delay < 0 then max_delay = nil end
    a = {server_time = now < 0, at = max(now, 1), given = cost, max_delay = max_delay,
      ttl_padding = ttl_padding, settle = settle, credit_at = credit_at}
    if attempts_count >= 1000 then attempts, attempts_count = {}, 0 end
    attempts[packed], attempts_count = a, attempts_count + 1
  end
  if a.server_time then
    local time = call('TIME')
    local seconds = time[1]
    if seconds ~= time_seconds then time_seconds, time_micros = seconds, seconds * 1000000 end
    a.now = time_micros + time[2]
  else
    a.now = a.at
  end
  a.cost = a.given
  a.writes = a.cost > 0
  return a
end
