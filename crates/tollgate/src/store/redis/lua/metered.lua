-- A reservation made, and one committed, each in one call on one server (src/store/book.rs):
-- the batch and its record together, so that no other call comes between them. (On a cluster
-- the record's slot is not the keys', and the store makes two calls.)

-- keys[1] the book's index, keys[2] the record, then a batch's keys. args[1] three
-- little-endian doubles: when the record expires (µs), its key's TTL (ms), the most records
-- the book keeps; args[2] the record; args[3...] a batch's arguments. Decides the batch; if it
-- is admitted, keeps the record. A full book decides it dry, writing nothing. Returns one
-- little-endian double, 0: the book is full; 1: admitted, the record kept; 2: not admitted;
-- then the batch's verdicts.
local function reserve(keys, args)
  if not floor then bind() end
  local expires, ttl, most = unpack_packed(KEEP_FORMAT, args[1])
  local full = call('ZCARD', keys[1]) >= most
  local verdicts, admitted = run_batch(keys, 3, args, 3, full)
  if full then return pack('<d', 0) .. verdicts end
  if not admitted then return pack('<d', 2) .. verdicts end
  call('SET', keys[2], args[2], 'PX', decimal(ttl))
  call('ZADD', keys[1], expires, keys[2])
  return pack('<d', 1) .. verdicts
end

-- keys[1] the book's index, keys[2] the record, then a settlement's keys: the record's items.
-- args[1] two little-endian doubles: the real cost, and now (µs, the caller's clock, which
-- reservations expire by); args[2...] a settlement's arguments, each item's cost its estimate
-- and args[2] saying when the estimates were taken. Takes the record out. Returns '' when there
-- was none (unknown, settled or expired and settled); 'E' and the record when it had expired
-- (the caller settles it as its rules say); else 'S' and the verdicts of a look at every item
-- after each took what the real cost exceeds its estimate by, or gave back what it falls short.
local function commit(keys, args)
  if not floor then bind() end
  local actual, now = unpack_packed(COMMIT_FORMAT, args[1])
  local record = call('GET', keys[2])
  call('ZREM', keys[1], keys[2])
  if not record then return '' end
  call('DEL', keys[2])
  -- When it expires: after its id (its length, then its bytes) and when it was taken.
  local id_length = unpack_packed('<I8', record)
  local expires = unpack_packed('<I8', record, 17 + id_length)
  if expires <= now then return 'E' .. record end
  return 'S' .. settle_items(keys, 3, args, 2, actual)
end
