-- A batch: items of any rules and algorithms, decided all-or-nothing in one call. Every item
-- is asked first without writing; only if all admit (items of rules in shadow mode aside) does
-- each write its cost. A denied batch writes only what a denial records (denied).
--
-- keys     the items' keys, in order: one per item, or one per tier for the sliding log
-- args[1]  the check, as for one item (its cost is unused)
-- args[2]  little-endian doubles: dry run (1 asks and writes nothing), then four per item:
--          algorithm (its index in `algorithms`), cost, shadow (1/0), number of keys
-- args[3...] each item's tiers, as args[2] of one item
-- Returns the verdicts of every tier of every item, in order, as one item's reply does.

local function batch(keys, args)
  -- A copy: the cached attempt of args[1] must keep its own cost for later calls.
  local check = attempt_of(args[1])
  local a = {now = check.now, max_delay = check.max_delay, ttl_padding = check.ttl_padding}
  local n = #args - 2
  local dry, position = unpack_packed('<d', args[2])
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

  -- Write: the costs of an admitted batch, or what denials record.
  if dry ~= 1 then
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
  return pack('<' .. rep('d', #reply), unpack(reply))
end
