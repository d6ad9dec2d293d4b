-- Counters of permits per window, shared by the hybrid and lease stores: one integer key per
-- rule, key, tier and aligned window, expiring after its window (and the next, which a sliding
-- window weighs it in). Every function reads the server's TIME, so that instances agree on
-- windows whatever their clocks say, and returns it first.

-- Adds each delta to its counter and returns the counts: a lease store handing back what it
-- did not use (negative; never below 0, never creating a counter), or any store reading (0).
-- args[1]  two little-endian doubles per key: delta, TTL (ms) for a counter it creates
-- Returns  little-endian doubles: now (µs), then each counter after the add.
local function add(keys, args)
  if not floor then bind() end
  local time = call('TIME')
  local reply = {time[1] * 1000000 + time[2]}
  local position = 1
  for i = 1, #keys do
    local key = keys[i]
    local delta, ttl
    delta, ttl, position = unpack_packed(ADD_FORMAT, args[1], position)
    local count
    if delta > 0 then
      count = call('INCRBY', key, decimal(delta))
      if count == delta then call('PEXPIRE', key, decimal(ttl)) end
    else
      count = tonumber(call('GET', key) or '0')
      if delta < 0 and count > 0 then
        count = call('DECRBY', key, decimal(min(-delta, count)))
      end
    end
    reply[i + 1] = count
  end
  return pack(doubles(#reply), unpack(reply))
end

-- The caller's time (µs) in a packed double, or the server's TIME where it is -1.
local function caller_now(packed)
  local now = unpack_packed('<d', packed)
  if now >= 0 then return now end
  local time = call('TIME')
  return time[1] * 1000000 + time[2]
end

-- Leases permits from each counter's budget to one instance: up to `want`, its own due (its
-- even share of the limit, less what it leased), and beyond that as many as the limit leaves
-- once the other instances leasing from it have their due: each its even share of the
-- limit (among the instances that leased within `stale`), less what it leased already, and no
-- more than its rate would spend in the rest of the window (a quarter more), when its rate is
-- known. So equally busy instances end up with equal shares, and an idle one holds nothing
-- back. Once fewer than `threshold` are left, at most half of what is left, so that the last
-- permits spread over the instances that still need them; but never less than `need` (what
-- the check at hand needs) while what the others are due leaves that many. Each window's
-- lessees are a hash (instance id -> "leased rate last"), rate in thousandths of a permit per
-- second.
-- args[1]  the instance's id
-- args[2]  eight little-endian doubles per item: want, need, limit, TTL (ms), threshold, this
--          instance's rate (permits per second; 0: not known yet), window end (µs), stale (µs)
-- args[3]  a little-endian double: the caller's time (µs), or -1 for the server's TIME
-- keys     per item: the window's counter, then its lessees
-- Returns  little-endian doubles: now (µs), then per item: granted, counted after the grant.
local function lease(keys, args)
  if not floor then bind() end
  local now = caller_now(args[3])
  local me, packed = args[1], args[2]
  local reply = {now}
  local position, i = 1, 1
  while position <= #packed do
    local counter, lessees = keys[2 * i - 1], keys[2 * i]
    local want, need, limit, ttl, threshold, rate, window_end, stale
    want, need, limit, ttl, threshold, rate, window_end, stale, position =
      unpack_packed(LEASE_FORMAT, packed, position)
    local used = tonumber(call('GET', counter) or '0')
    local left = max(limit - used, 0)
    local held = call('HGETALL', lessees)
    local others, mine = {}, 0
    for f = 1, #held, 2 do
      local leased, their_rate, last = string.match(held[f + 1], '^(%d+) (%d+) (%d+)$')
      leased, their_rate, last = tonumber(leased), tonumber(their_rate), tonumber(last)
      if held[f] == me then
        mine = leased
      elseif last + stale > now then
        others[#others + 1] = {leased, their_rate / 1000}
      end
    end
    local fair = ceil(limit / (#others + 1))
    local remaining = max(window_end - now, 0) / 1000000
    local due = 0
    for o = 1, #others do
      local owed = max(fair - others[o][1], 0)
      if others[o][2] > 0 then owed = min(owed, ceil(others[o][2] * remaining * 1.25)) end
      due = due + owed
    end
    -- Its own due first: what the others are due beyond that is theirs.
    local available = min(max(left - due, fair - mine, 0), left)
    local grant = min(want, available)
    if left < threshold then grant = min(grant, ceil(left / 2)) end
    grant = min(max(grant, need), available)
    if grant > 0 then
      used = call('INCRBY', counter, decimal(grant))
      if used == grant then call('PEXPIRE', counter, decimal(ttl)) end
    end
    call('HSET', lessees, me,
      string.format('%d %d %d', mine + grant, floor(rate * 1000), now))
    call('PEXPIRE', lessees, decimal(ttl))
    reply[2 * i], reply[2 * i + 1] = grant, used
    i = i + 1
  end
  return pack(doubles(#reply), unpack(reply))
end

-- The hybrid store's sync: each item pushes what one instance admitted to a window's counter
-- and, unless it only pushes, replaces that instance's claim on the window. A claim is the
-- permits beyond the count that the instance may admit before its next sync; claims are kept
-- in a hash per window (instance id -> "amount expiry"), and a claim is granted only from what
-- the limit leaves once the count and the other instances' live claims are taken out, at most
-- an even share of it among the instances claiming. So the count, plus every live claim, stays
-- within the limit, and instances that admit only within their claims never exceed it. A claim
-- is at least `keep`, what the instance may still admit under its previous claim before it
-- hears this answer. Claims expire unless renewed, so a stopped instance holds nothing for long.
-- An item of kind 3 instead registers the instance as running, in a sorted set of instances
-- by when each last synced, and counts those seen within its TTL.
-- args[1]  the instance's id
-- args[2]  nine little-endian doubles per item: kind (0: push only; 1: fixed window; 2: sliding
--          window; 3: presence), delta, TTL (ms), limit, want, keep, claim TTL (µs), period
--          (µs), window start (µs)
-- args[3]  a little-endian double: the caller's time (µs), or -1 for the server's TIME
-- keys     per item: its window's counter (the set of instances, for presence); then, for a
--          window, the window's claims; then, for a sliding window, the counter of the window
--          before
-- Returns  little-endian doubles: now (µs), then five per item: the count (of instances, for
--          presence), the other instances' live claims, this instance's claim, the instances
--          claiming (this one included), and for a sliding window the count of the window
--          before
local function claim(keys, args)
  if not floor then bind() end
  local now = caller_now(args[3])
  local me, packed = args[1], args[2]
  local reply = {now}
  local position, k = 1, 1
  while position <= #packed do
    local kind, delta, ttl, limit, want, keep, claim_ttl, period, start
    kind, delta, ttl, limit, want, keep, claim_ttl, period, start, position =
      unpack_packed(CLAIM_FORMAT, packed, position)
    local counter = keys[k]
    k = k + 1
    local count
    if kind == 3 then
      call('ZADD', counter, now, me)
      call('ZREMRANGEBYSCORE', counter, '-inf', string.format('(%d', now - ttl * 1000))
      call('PEXPIRE', counter, decimal(ttl))
      count = call('ZCARD', counter)
    elseif delta > 0 then
      count = call('INCRBY', counter, decimal(delta))
      if count == delta then call('PEXPIRE', counter, decimal(ttl)) end
    else
      count = tonumber(call('GET', counter) or '0')
    end
    local others, mine, claimers, previous = 0, 0, 1, 0
    if kind == 1 or kind == 2 then
      local claims = keys[k]
      k = k + 1
      if kind == 2 then
        previous = tonumber(call('GET', keys[k]) or '0')
        k = k + 1
      end
      local held = call('HGETALL', claims)
      for i = 1, #held, 2 do
        if held[i] ~= me then
          local amount, expires = string.match(held[i + 1], '^(%d+) (%d+)$')
          if tonumber(expires) > now then
            others, claimers = others + tonumber(amount), claimers + 1
          else
            call('HDEL', claims, held[i])
          end
        end
      end
      local used = count + others
      local elapsed = now - start
      if kind == 2 and elapsed < period then
        used = used + previous * ((period - elapsed) / period)
      end
      local left = max(floor(limit - used), 0)
      mine = max(min(want, ceil(left / claimers)), keep)
      if mine > 0 then
        call('HSET', claims, me, string.format('%d %d', mine, now + claim_ttl))
        call('PEXPIRE', claims, decimal(ttl))
      else
        call('HDEL', claims, me)
      end
    end
    local at = #reply
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] =
      count, others, mine, claimers, previous
  end
  return pack(doubles(#reply), unpack(reply))
end
