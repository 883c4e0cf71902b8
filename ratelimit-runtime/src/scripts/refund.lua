-- ratelimit: peek and refund, for Redis Cluster calls whose limits fall in
-- several slots (store/cluster.rs). Appended to the prelude and the four
-- algorithms instead of the driver.
--
-- ARGV[1] is the mode, ARGV[2] the microseconds the caller measured from just
-- before it sent the call's check to just before it sent this script (an upper
-- bound of the server time between the two), then 6 arguments per key: the
-- driver's 5 (algorithm code, limit, period µs, burst, cost) and the
-- reset_after µs that the check answered for this key.
--
--   peek    reads only: the state of each limit now, for limits of the call
--           that were never checked because another slot rejected first;
--   refund  gives back what an admitted check of the same call took, then
--           reads the state as peek does.
--
-- The reply is the driver's rejected-call reply: per key {admitted (0/1),
-- remaining, reset_after µs, retry_after µs}.
--
-- A refund never gives back more units than the call took:
--   fixed    DECRBY cost, only in the window the call was counted in (a newer
--            window ends at least a period after it; when the period is not
--            longer than the measured delay, nothing is given back); a window
--            left empty is deleted, as if the call had never opened it;
--   sliding  removes `cost` of the OLDEST live entries: remaining is restored
--            exactly, and entries that stay are never older than the truth, so
--            the window can only free later, never earlier;
--   leaky    the level drops by cost (at least to empty);
--   token    the missing tokens drop by cost (at most to full). For the two
--            buckets, a bucket that would have been completely empty (leaky)
--            or full (token) during the refund's own round trip is credited at
--            most that round trip's drain/refill on top.
local mode = ARGV[1]
local elapsed = tonumber(ARGV[2])
local nkeys = #KEYS
if (mode ~= 'peek' and mode ~= 'refund') or elapsed == nil or elapsed < 0
  or nkeys == 0 or #ARGV ~= 2 + 6 * nkeys then
  return redis.error_reply('ERR ratelimit: expected peek|refund, a delay and 6 arguments per key, got ' .. #ARGV .. ' for ' .. nkeys .. ' keys')
end

local function refund_bucket(key, p)
  local value = redis.call('GET', key)
  if not value then
    return
  end
  local stored, at = string.match(value, '^(%d+):(%d+)$')
  if not stored then
    return
  end
  local g = gcd(p.limit, p.period)
  local rate = p.limit / g
  local unit = p.period / g
  local level = math.max(tonumber(stored) - math.max(now - tonumber(at), 0) * rate, 0)
  level = level - p.cost * unit
  if level <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, int(level) .. ':' .. int(now), 'PX', ttl_ms(ceil_div(level, rate)))
  end
end

local REFUND = {}
REFUND[1] = function(key, p, reset)
  local value = redis.call('GET', key)
  if not value then
    return
  end
  local n = tonumber(value)
  local pttl = redis.call('PTTL', key)
  if n == nil or pttl <= 0 then
    return
  end
  -- Our window ended `reset` after our check, which ran at most `elapsed`
  -- ago; a newer window ends at least `period` after ours. With 2 ms of slack
  -- for PTTL's millisecond resolution on each side, the window is ours when
  -- it ends no later than `reset` from now and the period is longer than the
  -- delay.
  if p.period <= elapsed + 4000 or pttl * 1000 > reset + 2000 then
    return
  end
  if n <= p.cost then
    redis.call('DEL', key)
  else
    redis.call('DECRBY', key, int(p.cost))
  end
end
REFUND[2] = function(key, p)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - p.period))
  redis.call('ZPOPMIN', key, int(p.cost))
end
REFUND[3] = refund_bucket
REFUND[4] = refund_bucket

local reply = {}
for i = 1, nkeys do
  local base = 2 + 6 * (i - 1)
  local code = tonumber(ARGV[base + 1])
  local algo = ALGOS[code]
  if algo == nil then
    return redis.error_reply('ERR ratelimit: this script has no algorithm with code ' .. tostring(ARGV[base + 1]))
  end
  local p = {
    limit = tonumber(ARGV[base + 2]),
    period = tonumber(ARGV[base + 3]),
    burst = tonumber(ARGV[base + 4]),
    cost = tonumber(ARGV[base + 5]),
  }
  local reset = tonumber(ARGV[base + 6])
  if not (p.limit and p.period and p.burst and p.cost and reset)
    or p.limit < 1 or p.period < 1000 or p.burst < 1 or p.cost < 1 or reset < 0 then
    return redis.error_reply('ERR ratelimit: invalid parameters for key ' .. i)
  end
  if mode == 'refund' then
    REFUND[code](KEYS[i], p, reset)
  end
  local d = algo.evaluate(KEYS[i], p)
  reply[i] = { d.admitted and 1 or 0, d.now_remaining, d.now_reset, d.retry }
end
return reply
