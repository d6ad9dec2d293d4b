-- Reservations' records (src/store/book.rs), kept until settled: one string key per record and
-- one sorted set, the index, of every record by when it expires (µs). All in one slot (their
-- names share a hash tag), so a call is atomic on a cluster too.

-- keys[1] the index, keys[2] the record. args[1] the record; args[2] three little-endian
-- doubles: when it expires (µs), its key's TTL (ms), the most records kept. Keeps it unless
-- the index holds the most already. Returns one double: 1 kept, 0 refused.
local function keep(keys, args)
  if not floor then bind() end
  local expires, ttl, most = unpack_packed(KEEP_FORMAT, args[2])
  if call('ZCARD', keys[1]) >= most then return pack('<d', 0) end
  call('SET', keys[2], args[1], 'PX', decimal(ttl))
  call('ZADD', keys[1], expires, keys[2])
  return pack('<d', 1)
end

-- keys[1] the index, keys[2] the record: takes the record out. Returns it, or an empty string
-- when there is none (unknown, settled, or expired).
local function take(keys, args)
  if not floor then bind() end
  local record = call('GET', keys[2])
  call('ZREM', keys[1], keys[2])
  if not record then return '' end
  call('DEL', keys[2])
  return record
end

-- keys[1] the index. args[1] two little-endian doubles: now (µs), the most records taken.
-- Takes out the records expired at now, oldest first. Returns each after its length (one
-- little-endian double).
local function expired(keys, args)
  if not floor then bind() end
  local now, most = unpack_packed(EXPIRED_FORMAT, args[1])
  local names = call('ZRANGEBYSCORE', keys[1], '-inf', decimal(now), 'LIMIT', 0, most)
  local out = {}
  for _, name in ipairs(names) do
    local record = call('GET', name)
    call('ZREM', keys[1], name)
    if record then
      call('DEL', name)
      out[#out + 1] = pack('<d', #record) .. record
    end
  end
  return table.concat(out)
end
