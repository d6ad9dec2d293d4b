-- Driver of the sliding log: every tier is asked first; only if all admit are the permits
-- logged, at the newest time already logged if the clock is behind it (keeping the order).
-- A member is "time:n", n counting the members of that time, so members never collide. Older
-- members than the window are dropped and the set expires when its newest permit leaves.

local verdicts, newest = {}, {}
local allowed = true
for i, t in ipairs(tiers) do
  verdicts[i], newest[i] = decide(t, KEYS[i], attempt)
  allowed = allowed and verdicts[i][1] == 1
end

if allowed and attempt.cost > 0 then
  for i, t in ipairs(tiers) do
    local key = KEYS[i]
    local at = max(now, newest[i])
    local at_stamp = stamp(at)
    local seen = redis.call('ZCOUNT', key, at_stamp, at_stamp)
    local batch = {}
    for j = 1, attempt.cost do
      batch[#batch + 1] = at
      batch[#batch + 1] = at_stamp .. ':' .. stamp(seen + j)
      if #batch >= 1000 or j == attempt.cost then
        redis.call('ZADD', key, unpack(batch))
        batch = {}
      end
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', stamp(now - t.period))
    redis.call('PEXPIRE', key, ceil_div(at + t.period - now, 1000) + ttl_padding)
  end
end

return reply(verdicts)
