-- A batch: items of any rules and algorithms, decided all-or-nothing in one call. Every item
-- decides, its cost written into the state read (a verdict does not depend on writing); only
-- if all admit (items of rules in shadow mode aside) is each admitted item's state stored. A
-- denied batch stores only what a denial records (denied), on the state as it was read.
--
-- keys     the items' keys, in order: one per item, or one per tier for the sliding log
-- args[1]  the check, as for one item (its cost is unused)
-- args[2]  little-endian doubles: 1 to ask and write nothing (else 0), then four per item:
--          algorithm (its index in `algorithms`), cost, shadow (1/0), number of keys
-- args[3...] each item's tiers, as args[2] of one item
-- Returns the verdicts of every tier of every item, in order, as one item's reply does, then
-- the time of the check (µs, a little-endian double): a check across cluster slots gives back
-- what it took at that time when another slot denies.
-- (run_batch does it for keys[first_key...] and args[first_arg...], and returns the
-- verdicts, and the time if `timed`, then whether the batch was admitted; `dry_run` makes it
-- ask whatever args[first_arg + 1] says.)

-- The verdicts and items of the batch being run: the same tables for every call, grown once
-- to the most a batch has had (a call runs alone, and its reply is packed before it returns;
-- each item's fields are all set again).
local verdicts_of_batch, items_of_batch = {}, {}

local function run_batch(keys, first_key, args, first_arg, dry_run, timed)
  -- The cached attempt of args[first_arg]: its cost becomes each item's in turn (attempt_of
  -- gives it its own back at each call).
  local a = attempt_of(args[first_arg])
  local n, described = #args - first_arg - 1, args[first_arg + 1]
  local dry, position = unpack_packed(BATCH_FORMAT, described)
  local writes = dry ~= BATCH_LOOK and not dry_run

  -- Decide every item, its verdicts in `reply` from its `at`th value.
  local reply, items, admitted = verdicts_of_batch, items_of_batch, true
  local first, at = first_key, 0
  for i = 1, n do
    local algorithm, cost, shadow, count
    algorithm, cost, shadow, count, position = unpack_packed(ITEM_FORMAT, described, position)
    local packed = args[first_arg + 1 + i]
    local f, tiers = algorithms[algorithm], parsed[packed] or tiers_of(packed)
    local item = items[i]
    if not item then
      item = {}
      items[i] = item
    end
    -- The fields of the other driver keep what an earlier call left: the store below reads
    -- only those of its item's driver, all set here.
    item.f, item.cost, item.tiers, item.first = f, cost, tiers, first
    a.cost = cost
    a.writes = false
    local allowed
    if f.log then
      -- Its newest times' table kept with the item between calls: each tier's is set again.
      local newest = item.newest
      if not newest then
        newest = {}
        item.newest = newest
      end
      allowed = log_ask(tiers, keys, first, a, f.decide, reply, newest, at)
    else
      local stored = call('GET', keys[first])
      local w, original = read_state(tiers, stored, a, f.expires_at, f.forgets)
      item.stored, item.original, item.w = stored, original, w
      local one = tiers.one
      if one then
        -- One tier, as most items have: decided as ask() does, without its call and loop
        -- (2.4% of a check of two rules: 114.3k instructions through ask(), 111.6k here).
        item.kept = stored and f.expires_at(one, w)
        a.writes = writes and cost > 0
        local verdict, limit, remaining, reset_after, retry_after, delay = f.decide(one, w, a)
        reply[at + 1] = verdict
        reply[at + 2] = limit
        reply[at + 3] = remaining
        reply[at + 4] = reset_after
        reply[at + 5] = retry_after
        reply[at + 6] = delay
        allowed = verdict == 1
      else
        item.kept = stored and latest(tiers, w, f.expires_at)
        allowed = ask(tiers, w, a, f.decide, reply, writes, at)
      end
    end
    item.allowed = allowed
    admitted = admitted and (allowed or shadow == 1)
    first, at = first + count, at + VERDICT_DOUBLES * #tiers
  end

  -- Store: the costs of an admitted batch, or what denials record.
  if writes then
    for i = 1, n do
      local item = items[i]
      local f, tiers, cost = item.f, item.tiers, item.cost
      a.cost = cost
      if cost > 0 and (item.allowed or not admitted) then
        if f.log then
          if admitted then log_commit(tiers, keys, item.first, a, item.newest) end
        else
          local w, one = item.w, tiers.one
          if not admitted then
            w = {unpack_packed(tiers.state_format, item.original)}
            for t = 1, #tiers do f.denied(tiers[t], w, a) end
          end
          local expires = one and f.expires_at(one, w) or latest(tiers, w, f.expires_at)
          write(keys[item.first], item.stored, tiers, w, a, expires, item.kept)
        end
      end
    end
  end
  if timed then at = at + 1; reply[at] = a.now end
  return pack(formats[at] or doubles(at), unpack(reply, 1, at)), admitted
end

local function batch(keys, args)
  return (run_batch(keys, 1, args, 1, false, true))
end

-- A settlement: every item takes its cost whatever its key's state (a report), or gives it
-- back (a credit, of a cost taken at args[1]'s time), or renews the lease of as many slots
-- held (a renewal: nothing for algorithms that hold none), each on its own: nothing is
-- refused.
-- Arguments as a batch's (mode unused). Returns every tier's verdict of a look (cost 0) after
-- the settlement, as a batch does: denied while the key is in debt.
-- (settle_items does it for keys[first_key...] and args[first_arg...], and with `actual`, a
-- reservation's real cost, each item reports what it exceeds the item's cost by, or gives back
-- what it falls short of it by.)
local function settle_items(keys, first_key, args, first_arg, actual)
  -- The cached attempt of args[first_arg] (no delay, as the store sends a settlement): each
  -- item's cost becomes its own in turn, as in a batch.
  local a = attempt_of(args[first_arg])
  local report, renew = a.settle == SETTLE_REPORT, a.settle == SETTLE_RENEW
  local described = args[first_arg + 1]
  local _, position = unpack_packed(BATCH_FORMAT, described)
  local first, reply, at = first_key, verdicts_of_batch, 0
  for i = first_arg + 2, #args do
    local algorithm, cost, shadow, count
    algorithm, cost, shadow, count, position = unpack_packed(ITEM_FORMAT, described, position)
    local f, tiers = algorithms[algorithm], parsed[args[i]] or tiers_of(args[i])
    local change = f.credit
    if actual then
      -- Slots held come back whole, whatever the work cost.
      if f.slots then change = f.credit
      elseif actual > cost then change, cost = f.debit, actual - cost
      elseif actual < cost then cost = cost - actual
      else change = nil end
    elseif report then
      change = f.debit
    elseif renew then
      change = f.renew
    end
    -- Nothing settled at no cost: the state stays as it is, a key never seen too.
    if cost <= 0 then change = nil end
    if f.log then
      a.cost = cost
      if change then
        for t = 1, #tiers do change(tiers[t], keys[first + t - 1], a) end
      end
      a.cost = 0
      log_ask(tiers, keys, first, a, f.decide, reply, newest_of_log, at)
    else
      local key, one = keys[first], tiers.one
      local stored = call('GET', key)
      local w = read_state(tiers, stored, a, f.expires_at, f.forgets)
      local kept
      if change then
        kept = stored and (one and f.expires_at(one, w) or latest(tiers, w, f.expires_at))
        a.cost = cost
        for t = 1, #tiers do change(tiers[t], w, a) end
      end
      a.cost = 0
      ask(tiers, w, a, f.decide, reply, false, at)
      if change then
        local expires = one and f.expires_at(one, w) or latest(tiers, w, f.expires_at)
        write(key, stored, tiers, w, a, expires, kept)
      end
    end
    first, at = first + count, at + VERDICT_DOUBLES * #tiers
  end
  return pack(formats[at] or doubles(at), unpack(reply, 1, at))
end

local function settle(keys, args)
  return settle_items(keys, 1, args, 1, nil)
end
