-- A batch: items of any rules and algorithms, decided all-or-nothing in one call. Every item
-- is asked first without writing; only if all admit (items of rules in shadow mode aside) does
-- each write its cost. A denied batch writes only what a denial records (denied).
--
-- keys     the items' keys, in order: one per item, or one per tier for the sliding log
-- args[1]  the check, as for one item (its cost is unused)
-- args[2]  little-endian doubles: the mode (0 decides; 1 asks and writes nothing; 2 decides
--          and replies with the verdicts of the ask too, as a slot of a check across slots
--          does: a denied check answers with those), then four per item: algorithm (its index
--          in `algorithms`), cost, shadow (1/0), number of keys
-- args[3...] each item's tiers, as args[2] of one item
-- Returns the verdicts of every tier of every item, in order, as one item's reply does (in
-- mode 2, then those of the ask), then the time of the check (µs, a little-endian double): a
-- check across cluster slots gives back what it took at that time when another slot denies.
-- (run_batch returns the verdicts, whether the batch was admitted and the time; `dry_run`
-- makes it mode 1 whatever args[2] says.)

local function run_batch(keys, args, dry_run)
  -- A copy: the cached attempt of args[1] must keep its own cost for later calls.
  local check = attempt_of(args[1])
  local a = {now = check.now, max_delay = check.max_delay, ttl_padding = check.ttl_padding}
  local n = #args - 2
  local mode, position = unpack_packed('<d', args[2])
  if dry_run then mode = 1 end
  local items = {}
  local first = 1
  for i = 1, n do
    local algorithm, cost, shadow, count
    algorithm, cost, shadow, count, position = unpack_packed('<dddd', args[2], position)
    local item = {
      algorithm = algorithms[algorithm], cost = cost, shadow = shadow == 1,
      tiers = tiers_of(args[2 + i]), first = first, verdicts = {}, newest = {},
    }
    first = first + count
    items[i] = item
  end

  -- Ask every item without writing.
  local admitted = true
  for i = 1, n do
    local item, f = items[i], items[i].algorithm
    a.cost = item.cost
    a.writes = false
    local allowed
    if f.log then
      allowed = log_ask(item.tiers, keys, item.first, a, f.decide, item.verdicts, item.newest)
    else
      local key = keys[item.first]
      item.stored = call('GET', key)
      item.w = {unpack_packed(item.tiers.state_format, item.stored or item.tiers.zero_state)}
      if item.stored and forgotten(item.tiers, item.w, a, f.expires_at, f.forgets) then
        item.w = {unpack_packed(item.tiers.state_format, item.tiers.zero_state)}
      end
      allowed = ask(item.tiers, item.w, a, f.decide, item.verdicts, false)
    end
    item.allowed = allowed
    admitted = admitted and (allowed or item.shadow)
  end

  local asked = {}
  if mode == 2 then
    for i = 1, n do
      for _, v in ipairs(items[i].verdicts) do asked[#asked + 1] = v end
    end
  end

  -- Write: the costs of an admitted batch, or what denials record.
  if mode ~= 1 then
    for i = 1, n do
      local item, f = items[i], items[i].algorithm
      a.cost = item.cost
      if item.cost > 0 and (item.allowed or not admitted) then
        local tiers = item.tiers
        if f.log then
          if admitted then log_commit(tiers, keys, item.first, a, item.newest) end
        else
          local w = item.w
          local kept = item.stored and latest(tiers, w, f.expires_at)
          if admitted then
            ask(tiers, w, a, f.decide, item.verdicts, true)
          else
            for t = 1, #tiers do f.denied(tiers[t], w, a) end
          end
          write(keys[item.first], item.stored, tiers, w, a, latest(tiers, w, f.expires_at), kept)
        end
      end
    end
  end

  local reply = {}
  for i = 1, n do
    for _, v in ipairs(items[i].verdicts) do reply[#reply + 1] = v end
  end
  for _, v in ipairs(asked) do reply[#reply + 1] = v end
  return pack('<' .. rep('d', #reply), unpack(reply)), admitted, a.now
end

local function batch(keys, args)
  local verdicts, _, now = run_batch(keys, args, false)
  return verdicts .. pack('<d', now)
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
  local settled = attempt_of(args[first_arg])
  local a = {now = settled.now, ttl_padding = settled.ttl_padding, credit_at = settled.credit_at}
  local report, renew = settled.settle == 1, settled.settle == 3
  local described = args[first_arg + 1]
  local _, position = unpack_packed('<d', described)
  local first, reply = first_key, {}
  for i = first_arg + 2, #args do
    local algorithm, cost, shadow, count
    algorithm, cost, shadow, count, position = unpack_packed('<dddd', described, position)
    local f, tiers = algorithms[algorithm], tiers_of(args[i])
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
    local verdicts = {}
    if f.log then
      a.cost = cost
      if change then
        for t = 1, #tiers do change(tiers[t], keys[first + t - 1], a) end
      end
      a.cost = 0
      log_ask(tiers, keys, first, a, f.decide, verdicts, {})
    else
      local key = keys[first]
      local stored = call('GET', key)
      local w = {unpack_packed(tiers.state_format, stored or tiers.zero_state)}
      if stored and forgotten(tiers, w, a, f.expires_at, f.forgets) then
        w = {unpack_packed(tiers.state_format, tiers.zero_state)}
      end
      a.cost = 0
      if change then
        local kept = stored and latest(tiers, w, f.expires_at)
        a.cost = cost
        for t = 1, #tiers do change(tiers[t], w, a) end
        a.cost = 0
        ask(tiers, w, a, f.decide, verdicts, false)
        write(key, stored, tiers, w, a, latest(tiers, w, f.expires_at), kept)
      else
        ask(tiers, w, a, f.decide, verdicts, false)
      end
    end
    for _, v in ipairs(verdicts) do reply[#reply + 1] = v end
    first = first + count
  end
  return pack('<' .. rep('d', #reply), unpack(reply))
end

local function settle(keys, args)
  return settle_items(keys, 1, args, 1, nil)
end
