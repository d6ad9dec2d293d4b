-- Sliding log (src/algorithm/sliding_log.rs), kept as one sorted set per tier (keys[i]): a
-- member per admitted permit, scored by its time. The k-th most recent member is the k-th
-- most recent entry of the Rust ring, so both decide alike.

-- The k-th most recent permit's time (1-based), if there is one among the last `limit`.
local function recent(t, key, k)
  if k < 1 or k > t.limit then return nil end
  local found = call('ZREVRANGE', key, k - 1, k - 1, 'WITHSCORES')
  return tonumber(found[2])
end

-- Takes a.cost permits whatever the log holds: at most `limit` are logged (the debt is one
-- full log), and the newest `limit` members are kept.
local function debit(t, key, a)
  local newest = recent(t, key, 1) or 0
  log_add(key, max(a.now, newest), min(a.cost, t.limit), newest)
  call('ZREMRANGEBYRANK', key, 0, -(t.limit + 1))
  log_expire(t, key, a, max(a.now, newest))
end

-- Gives back up to a.cost members still in the window and logged at or after the credit's
-- time, the oldest of them first.
local function credit(t, key, a)
  local from = max(a.credit_at, a.now - t.period + 1)
  local found = call('ZRANGEBYSCORE', key, decimal(from), '+inf', 'LIMIT', 0, a.cost)
  if #found > 0 then call('ZREM', key, unpack(found)) end
end

-- Decides without writing: the newest permit's time, then the verdict.
local function decide(t, key, a)
  local limit, period, cost, now = t.limit, t.period, a.cost, a.now
  local newest = recent(t, key, 1) or 0
  local used = call('ZCOUNT', key, '(' .. decimal(now - period), '+inf')
  local reset_after = 0
  if used > 0 then reset_after = newest + period - now end
  -- Only when the window holds too many for the cost can a permit in it block.
  local blocking = used + cost > limit and recent(t, key, limit + 1 - cost)
  if blocking and blocking + period > now then
    return newest, deny(limit, limit - used, reset_after, blocking + period - now)
  end
  if cost > 0 then reset_after = max(now, newest) + period - now end
  return newest, allow(limit, limit - used - cost, reset_after)
end
