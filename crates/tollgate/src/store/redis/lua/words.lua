-- Driver for algorithms whose state is a few words per tier, kept in one string key (KEYS[1])
-- as little-endian doubles, exact for every value kept; a missing key is all zeros, a key never
-- seen. Mirrors Rule::evaluate: one tier decides and writes at once; several are all asked
-- without writing first, and write only if all admit. The key is written only when its state
-- changed, with one SET that also sets when it expires: when its state becomes equivalent to
-- a key never seen.

local key = KEYS[1]
local format = '<' .. string.rep('d', offset)
local w, old = {}, {}
local stored = redis.call('GET', key)
if stored then
  w = {struct.unpack(format, stored)}
  w[offset + 1] = nil
else
  for i = 1, offset do w[i] = 0 end
end
for i = 1, offset do old[i] = w[i] end

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

local changed = false
for i = 1, offset do changed = changed or w[i] ~= old[i] end
if changed then
  local expires = 0
  for _, t in ipairs(tiers) do expires = max(expires, expires_at(t, w)) end
  local ttl = ceil_div(expires - now, 1000)
  if ttl > 0 then
    redis.call('SET', key, struct.pack(format, unpack(w)), 'PX', ttl + ttl_padding)
  else
    redis.call('DEL', key)
  end
end

return reply(verdicts)
