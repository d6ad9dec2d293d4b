-- Global rules across regions (src/store/regions): each region's Redis keeps, per rule, key,
-- tier and bucket of time, one hash of every region's counts. `+<region>` is what that region
-- admitted, `-<region>` what it gave back; both only grow, so a copy is merged by keeping the
-- larger value, in any order, any number of times. `a<peer>` is this region's `+` that the
-- peer confirmed holding: what it admitted beyond that, the peer may not know yet.

-- The doubles of a packed string, one at a time.
local function reader(packed)
  local position = 1
  return function()
    local value
    value, position = unpack_packed('<d', packed, position)
    return value
  end
end

-- A bucket's hash: the net count of every region, this region's `+`, and the peers' acks.
local function bucket_of(key, own)
  local fields = call('HGETALL', key)
  local total, mine, acks = 0, 0, {}
  for i = 1, #fields, 2 do
    local name, value = fields[i], tonumber(fields[i + 1])
    local kind = string.sub(name, 1, 1)
    if kind == '+' then
      total = total + value
      if name == own then mine = value end
    elseif kind == '-' then
      total = total - value
    elseif kind == 'a' then
      acks[string.sub(name, 2)] = value
    end
  end
  return total, mine, acks
end

-- Decides items of global rules in this region, all-or-nothing (REGIONS_CHECK), or takes
-- (REGIONS_REPORT) or gives back (REGIONS_CREDIT) their costs whatever the counts say.
-- A tier admits when its weighted merged count, plus the cost, is within the limit, and
-- when this region's permits not yet confirmed by every live peer stay within the in-flight
-- allowance (or are none; a look, of cost 0, is never held back by them). While a peer is stale, what this region admitted that a stale
-- peer has not confirmed counts once more for each peer (unless the rule falls back to its
-- per-region limit): each region then admits at most 1 / regions of what was left, whoever
-- it still hears. The cost goes into each tier's current bucket.
-- args[1]  this region's name
-- args[2]  the head (REGIONS_HEAD doubles): mode, peers, reply width per item
-- args[3..2+peers]  the peers' names
-- args[3+peers]  per item REGIONS_ITEM doubles (cost, shadow, tiers, on partition, which
--          peers are stale: bit p-1 for peer p), then per tier REGIONS_TIER doubles and
--          its weights
-- keys     per item, per tier, its buckets, oldest first
-- Returns  little-endian doubles: 0, then per item the reply width's doubles.
local function regional_check(keys, args)
  if not floor then bind() end
  local head = reader(args[2])
  local mode, peers, width = head(), head(), head()
  local own = '+' .. args[1]
  local items = reader(args[3 + peers])
  local reply, writes, admitted_all, k = {0}, {}, true, 0
  -- Items are read until the keys run out: each consumes its tiers' buckets.
  while k < #keys do
    local cost, shadow, tiers, on_partition, mask = items(), items(), items(), items(), items()
    local live, stale = {}, {}
    for p = 1, peers do
      local bit = 2 ^ (p - 1)
      if mask % (2 * bit) >= bit then stale[#stale + 1] = args[2 + p]
      else live[#live + 1] = args[2 + p] end
    end
    local base = #reply
    reply[base + 1], reply[base + 2] = 1, 0
    local pending = {}
    for t = 1, tiers do
      local limit, allowance, buckets, ttl = items(), items(), items(), items()
      local merged, in_flight, assumed = 0, 0, 0
      local current
      for _ = 1, buckets do
        k = k + 1
        local weight = items()
        local total, mine, acks = bucket_of(keys[k], own)
        merged = merged + weight * total
        if #live > 0 then
          local confirmed = mine
          for _, peer in ipairs(live) do confirmed = min(confirmed, acks[peer] or 0) end
          in_flight = in_flight + (mine - confirmed)
        end
        if on_partition == 0 and #stale > 0 then
          local unconfirmed = 0
          for _, peer in ipairs(stale) do
            unconfirmed = max(unconfirmed, mine - (acks[peer] or 0))
          end
          assumed = assumed + weight * peers * unconfirmed
        end
        current = keys[k]
      end
      if #stale > 0 then reply[base + 2] = 1 end
      local why = 0
      if mode == REGIONS_CHECK or mode == REGIONS_LOOK then
        if merged + assumed + cost > limit then
          why = 1
        elseif cost > 0 and in_flight > 0 and in_flight + cost > allowance then
          why = 2
        end
      end
      if why > 0 then reply[base + 1] = 0 end
      local at = base + REGIONS_ITEM_ANSWER + (t - 1) * REGIONS_TIER_ANSWER
      reply[at + 1], reply[at + 2], reply[at + 3] = merged + assumed, in_flight, why
      pending[#pending + 1] = {current, cost, ttl}
    end
    -- A rule in shadow mode that would deny neither denies the batch nor counts.
    if reply[base + 1] == 1 or mode == REGIONS_REPORT or mode == REGIONS_CREDIT then
      for _, w in ipairs(pending) do writes[#writes + 1] = w end
    elseif shadow == 0 then
      admitted_all = false
    end
    for i = #reply + 1, base + width do reply[i] = 0 end
  end
  if mode == REGIONS_REPORT or mode == REGIONS_CREDIT or (mode == REGIONS_CHECK and admitted_all) then
    local field = own
    if mode == REGIONS_CREDIT then field = '-' .. args[1] end
    for _, w in ipairs(writes) do
      if w[2] > 0 then
        call('HINCRBY', w[1], field, decimal(w[2]))
        call('PEXPIRE', w[1], decimal(w[3]))
      end
    end
  end
  return pack(doubles(#reply), unpack(reply))
end

-- This region's side of a replication round: takes in what the peers' merges answered
-- (each peer's hold of this region's `+` becomes its ack, and restores this region's own
-- `+` if a restart lost it; each peer's own counts are merged), then reads this region's
-- counts of each key, to send.
-- args[1]  this region's name
-- args[2]  per key REGIONS_SYNC doubles, then REGIONS_SYNC_PEER per peer
-- args[3..]  the peers' names
-- Returns  little-endian doubles: 0, then per key this region's `+` and `-`.
local function regional_sync(keys, args)
  if not floor then bind() end
  local values = reader(args[2])
  local own, given = '+' .. args[1], '-' .. args[1]
  local reply = {0}
  for i = 1, #keys do
    local key = keys[i]
    local ttl = values()
    local touched = false
    for p = 3, #args do
      local held, plus, minus = values(), values(), values()
      if held >= 0 then
        local peer = args[p]
        local ack = tonumber(call('HGET', key, 'a' .. peer) or '0')
        if held > ack then call('HSET', key, 'a' .. peer, decimal(held)) touched = true end
        -- A peer holds more of this region's count than this region: this Redis lost it
        -- (a restart). What it counts now was admitted since, on top of what the peer holds.
        local mine = tonumber(call('HGET', key, own) or '0')
        if held > mine then call('HSET', key, own, decimal(held + mine)) touched = true end
        for _, pair in ipairs({{'+' .. peer, plus}, {'-' .. peer, minus}}) do
          local old = tonumber(call('HGET', key, pair[1]) or '0')
          if pair[2] > old then call('HSET', key, pair[1], decimal(pair[2])) touched = true end
        end
      end
    end
    if touched then call('PEXPIRE', key, decimal(ttl)) end
    local counts = call('HMGET', key, own, given)
    reply[#reply + 1] = tonumber(counts[1] or '0')
    reply[#reply + 1] = tonumber(counts[2] or '0')
  end
  return pack(doubles(#reply), unpack(reply))
end

-- The peer's side of a replication round: keeps the sender's counts where they are larger
-- than those held, and answers what it holds.
-- args[1]  the sender's name
-- args[2]  this (the receiving) region's name
-- args[3]  per key REGIONS_MERGE doubles
-- Returns  little-endian doubles: 0, then per key REGIONS_MERGED doubles.
local function regional_merge(keys, args)
  if not floor then bind() end
  local values = reader(args[3])
  local plus, minus = '+' .. args[1], '-' .. args[1]
  local own, given = '+' .. args[2], '-' .. args[2]
  local reply = {0}
  for i = 1, #keys do
    local key = keys[i]
    local sent_plus, sent_minus, ttl = values(), values(), values()
    local held = call('HMGET', key, plus, minus, own, given)
    local held_plus = tonumber(held[1] or '0')
    local written = false
    if sent_plus > held_plus then
      call('HSET', key, plus, decimal(sent_plus))
      held_plus, written = sent_plus, true
    end
    if sent_minus > tonumber(held[2] or '0') then
      call('HSET', key, minus, decimal(sent_minus))
      written = true
    end
    if written then call('PEXPIRE', key, decimal(ttl)) end
    reply[#reply + 1] = held_plus
    reply[#reply + 1] = tonumber(held[3] or '0')
    reply[#reply + 1] = tonumber(held[4] or '0')
  end
  return pack(doubles(#reply), unpack(reply))
end
