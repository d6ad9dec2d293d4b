-- Driver of the sliding log: every tier is asked first; only if all admit are the permits
-- logged, at the newest time already logged if the clock is behind it (keeping the order).
-- A member is "time:n", n counting the members of that time, so members never collide. Older
-- members than the window are dropped and the set expires when its newest permit leaves.

-- Asks every tier (keys[first + i - 1] is tier i's set) without writing; puts the verdicts in
-- `verdicts`, from after its `base`th value, and each tier's newest logged time in `newest`.
-- True if every tier admits.
local function log_ask(tiers, keys, first, a, decide, verdicts, newest, base)
  local allowed = true
  for i = 1, #tiers do
    local v = base + VERDICT_DOUBLES * (i - 1)
    newest[i], verdicts[v + 1], verdicts[v + 2], verdicts[v + 3], verdicts[v + 4],
      verdicts[v + 5], verdicts[v + 6] = decide(tiers[i], keys[first + i - 1], a)
    allowed = allowed and verdicts[v + 1] == 1
  end
  return allowed
end

-- The scores and members of a ZADD: the same table for every call, grown once to the most
-- one ZADD sends (1,000 values), and filled from its start each time.
local members_to_add = {}

-- Adds `count` members at time `at` to the set `key`, whose newest member is at `newest` (0
-- for none): only members of that time can share a name with the new ones.
local function log_add(key, at, count, newest)
  local at_stamp = decimal(at)
  local seen = 0
  if at <= newest then seen = call('ZCOUNT', key, at_stamp, at_stamp) end
  local members, n = members_to_add, 0
  for j = 1, count do
    members[n + 1] = at
    members[n + 2] = at_stamp .. ':' .. decimal(seen + j)
    n = n + 2
    if n >= 1000 or j == count then
      call('ZADD', key, unpack(members, 1, n))
      n = 0
    end
  end
end

-- Drops the members older than the window and sets the set to expire when its newest
-- member, at `at`, leaves it.
local function log_expire(t, key, a, at)
  call('ZREMRANGEBYSCORE', key, '-inf', decimal(a.now - t.period))
  call('PEXPIRE', key, decimal(ceil_div(at + t.period - a.now, 1000) + a.ttl_padding))
end

-- Logs a.cost permits in every tier's set.
local function log_commit(tiers, keys, first, a, newest)
  for i = 1, #tiers do
    local key = keys[first + i - 1]
    local at = max(a.now, newest[i])
    log_add(key, at, a.cost, newest[i])
    log_expire(tiers[i], key, a, at)
  end
end

-- The verdicts and newest times of a check (the newest times of a settlement's look too): the
-- same tables for every call, grown once to the most tiers a check has had (a call runs
-- alone, its reply is packed before it returns, and each tier's entries are all set again).
local verdicts_of_log, newest_of_log = {}, {}

-- The function that checks a key of the algorithm of `decide`, which it keeps as an upvalue.
local function log_of(decide)
  return function(keys, args)
    local a, tiers = attempt_of(args[1]), parsed[args[2]] or tiers_of(args[2])
    local verdicts, newest = verdicts_of_log, newest_of_log
    if log_ask(tiers, keys, 1, a, decide, verdicts, newest, 0) and a.cost > 0 then
      log_commit(tiers, keys, 1, a, newest)
    end
    return pack(tiers.reply_format, unpack(verdicts, 1, VERDICT_DOUBLES * #tiers))
  end
end
