-- Driver for algorithms whose state is a few words per tier, kept as the fields 1..n of one
-- hash (KEYS[1]); a missing field is 0, and all zeros is a key never seen. Mirrors
-- Rule::evaluate: one tier decides and writes at once; several are all asked without writing
-- first, and write only if all admit. Only changed fields are written, and the key expires
-- when its state becomes equivalent to a key never seen.

local key = KEYS[1]
local w, old, fields = {}, {}, {}
for i = 1, offset do fields[i] = i end
local raw = redis.call('HMGET', key, unpack(fields))
for i = 1, offset do
  local v = tonumber(raw[i]) or 0
  w[i], old[i] = v, v
end

local verdicts = {}
local function run(commit)
  attempt.commit = commit
  local all = true
  for i, t in ipairs(tiers) do
    verdicts[i] = decide(t, w, attempt)
    all = all and verdicts[i][1] == 1
  end
  return all
end

local wants_write = attempt.cost > 0
local allowed
if #tiers == 1 or not wants_write then
  allowed = run(true)
else
  allowed = run(false) and run(true)
end
if not allowed and wants_write then
  for _, t in ipairs(tiers) do first_seen(t, w, now) end
end

local changed = {}
for i = 1, offset do
  if w[i] ~= old[i] then
    changed[#changed + 1] = i
    changed[#changed + 1] = w[i]
  end
end
if #changed > 0 then
  local expires = 0
  for _, t in ipairs(tiers) do expires = max(expires, expires_at(t, w)) end
  local ttl = ceil_div(expires - now, 1000)
  if ttl > 0 then
    redis.call('HSET', key, unpack(changed))
    redis.call('PEXPIRE', key, ttl + ttl_padding)
  else
    redis.call('DEL', key)
  end
end

local reply = {}
for _, v in ipairs(verdicts) do
  for j = 1, 6 do reply[#reply + 1] = v[j] end
end
return reply
