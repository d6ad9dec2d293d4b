-- Driver for algorithms whose state is a few words per tier, kept in one string key (keys[1])
-- as little-endian doubles, exact for every value kept; a missing key is all zeros, a key never
-- seen. Decides as Rule::evaluate does: the tiers admit together or not at all. Each tier
-- decides and writes at once (a verdict does not depend on writing); when one denies, the
-- state is read again and what a denial records is written instead. The key is written only when its state
-- changed, with one SET that also sets when it expires: when its state becomes equivalent to
-- a key never seen, rounded up to the next whole second. Within that second a key's later
-- writes keep the TTL the first set (KEEPTTL), which costs Redis less than setting one; a key
-- outlives its state by under a second, and an expired state reads as new anyway.

-- Asks every tier, writing admitted costs if `commit`; puts the verdicts in `verdicts`, from
-- after its `base`th value.
local function ask(tiers, w, a, decide, verdicts, commit, base)
  a.writes = commit and a.cost > 0
  local all, v = true, base
  for i = 1, #tiers do
    local allowed, limit, remaining, reset_after, retry_after, delay = decide(tiers[i], w, a)
    -- In order: a table grows at its end for less than it costs to fill it from the back.
    verdicts[v + 1] = allowed
    verdicts[v + 2] = limit
    verdicts[v + 3] = remaining
    verdicts[v + 4] = reset_after
    verdicts[v + 5] = retry_after
    verdicts[v + 6] = delay
    all, v = all and allowed == 1, v + VERDICT_DOUBLES
  end
  return all
end

-- Writes the words `w` to `key` if they differ from `stored`; they are as good as new at
-- `expires` (µs), and the key expires at the next whole second (PXAT, Redis 6.2 and later, on
-- the server's clock; on the caller's, PX). `kept` is when the stored words were as good as
-- new (false for none): the key lives at least until the whole second after, so when that
-- is no earlier, the key keeps its TTL. (`x + (-x) % s` rounds x up to a multiple of s,
-- exactly for integers below 2^53, without a call.)
local function write(key, stored, tiers, w, a, expires, kept)
  local n = tiers.words
  local state
  -- States of up to three words, the most common, packed without a call to unpack.
  if n == 2 then
    state = pack(tiers.state_format, w[1], w[2])
  elseif n == 3 then
    state = pack(tiers.state_format, w[1], w[2], w[3])
  elseif n == 1 then
    state = pack(tiers.state_format, w[1])
  else
    state = pack(tiers.state_format, unpack(w, 1, n))
  end
  if state == (stored or tiers.zero_state) then return end
  if expires > a.now then
    local at = expires + (-expires) % 1000000
    if kept and at <= kept + (-kept) % 1000000 then
      call('SET', key, state, 'KEEPTTL')
    elseif a.server_time then
      -- One time for every key written within a second: its text is formatted once.
      local ms = at / 1000 + a.ttl_padding
      call('SET', key, state, 'PXAT', decimals[ms] or decimal(ms))
    else
      call('SET', key, state, 'PX', decimal(floor((at - a.now + 999) / 1000) + a.ttl_padding))
    end
  elseif stored then
    call('DEL', key)
  end
end

-- When the words `w` of every tier are as good as new (µs). (max() written out: a call of it
-- per tier cost more than its comparison.)
local function latest(tiers, w, expires_at)
  if #tiers == 1 then return expires_at(tiers[1], w) end
  local at = 0
  for i = 1, #tiers do
    local expires = expires_at(tiers[i], w)
    if expires > at then at = expires end
  end
  return at
end

-- The state of a key as the words of every tier, and the string they were read from: the
-- stored one, or a key never seen's. An expired state of an algorithm whose expired state
-- differs from a key never seen's (`forgets`, see Decide::forgets) reads as new too.
local function read_state(tiers, stored, a, expires_at, forgets)
  local original = stored or tiers.zero_state
  local w = {unpack_packed(tiers.state_format, original)}
  if stored and forgets and forgets(tiers) and latest(tiers, w, expires_at) <= a.now then
    original = tiers.zero_state
    w = {unpack_packed(tiers.state_format, original)}
  end
  return w, original
end

-- The verdicts of a check of several tiers: the same table for every call, grown once to the
-- most a check has had (a call runs alone, and its reply is packed before it returns).
local verdicts_of_check = {}

-- The function that checks a key of the algorithm of `decide`, `denied`, `expires_at` and
-- `forgets`, which it keeps as upvalues: a check makes one Lua call fewer than through a
-- function that passes them on.
local function words_of(decide, denied, expires_at, forgets)
  return function(keys, args)
    local a, tiers = attempt_of(args[1]), parsed[args[2]] or tiers_of(args[2])
    local key = keys[1]
    local stored = call('GET', key)
    local w, original = read_state(tiers, stored, a, expires_at, forgets)

    local wants_write = a.writes
    local t = tiers.one
    if t then
      local kept = stored and expires_at(t, w)
      local allowed, limit, remaining, reset_after, retry_after, delay = decide(t, w, a)
      if allowed ~= 1 and wants_write then denied(t, w, a) end
      write(key, stored, tiers, w, a, expires_at(t, w), kept)
      return pack(tiers.reply_format, allowed, limit, remaining, reset_after, retry_after, delay)
    end
    local kept = stored and latest(tiers, w, expires_at)
    local verdicts = verdicts_of_check
    local allowed = ask(tiers, w, a, decide, verdicts, true, 0)
    if not allowed and wants_write then
      w = {unpack_packed(tiers.state_format, original)}
      for i = 1, #tiers do denied(tiers[i], w, a) end
    end
    write(key, stored, tiers, w, a, latest(tiers, w, expires_at), kept)
    return pack(tiers.reply_format, unpack(verdicts, 1, VERDICT_DOUBLES * #tiers))
  end
end
