-- Counters of permits per window, shared by the hybrid and lease stores: one integer key per
-- rule, key, tier and aligned window, expiring after its window (and the next, which a sliding
-- window weighs it in). Both functions read the server's TIME, so that instances agree on
-- windows whatever their clocks say, and return it first.

-- Adds each delta to its counter and returns the counts: a hybrid store pushing what it
-- admitted locally (0 only reads), or a lease store handing back what it did not use
-- (negative; never below 0, never creating a counter).
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
    delta, ttl, position = unpack_packed('<dd', args[1], position)
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
  return pack('<' .. rep('d', #reply), unpack(reply))
end

-- Leases permits from each counter's budget: up to `want`, as many as the limit leaves; once
-- fewer than `threshold` are left, at most half of what is left, so that the last permits
-- spread over the instances that still need them; but never less than `need` (what the
-- check at hand needs) while the limit leaves that many.
-- args[1]  five little-endian doubles per key: want, need, limit, TTL (ms), threshold
-- Returns  little-endian doubles: now (µs), then per key: granted, counted after the grant.
local function lease(keys, args)
  if not floor then bind() end
  local time = call('TIME')
  local reply = {time[1] * 1000000 + time[2]}
  local position = 1
  for i = 1, #keys do
    local key = keys[i]
    local want, need, limit, ttl, threshold
    want, need, limit, ttl, threshold, position = unpack_packed('<ddddd', args[1], position)
    local used = tonumber(call('GET', key) or '0')
    local left = max(limit - used, 0)
    local grant = want
    if left < threshold then grant = min(grant, ceil(left / 2)) end
    grant = min(max(grant, need), left)
    if grant > 0 then
      used = call('INCRBY', key, decimal(grant))
      if used == grant then call('PEXPIRE', key, decimal(ttl)) end
    end
    reply[2 * i], reply[2 * i + 1] = grant, used
  end
  return pack('<' .. rep('d', #reply), unpack(reply))
end
