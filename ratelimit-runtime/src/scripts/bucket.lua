-- token bucket (code 4) and leaky bucket (code 3): one rule under two names.
--
-- A bucket of capacity `burst` holds a level that drains continuously at
-- limit / period; a call raises it by `cost` when the result fits under
-- `burst`. For the leaky bucket the level is what is in the bucket (empty at
-- start, a call adds `cost` if it fits); for the token bucket it is the tokens
-- MISSING from a full bucket of `burst` tokens (full at start, refilled at
-- limit / period up to `burst`, a call takes `cost` tokens when there are
-- enough). The arithmetic is the same:
--   tokens >= cost         <=>  full - missing >= take  <=>  after <= full
--   floor(tokens)          =    burst - ceil(missing / unit)
--   retry (cost - tokens) / rate = (after - full) / rate
--
-- State: the string "<level>:<timestamp µs>", written with its TTL (time until
-- empty, i.e. until full for the token bucket) in one SET: an absent key is an
-- empty bucket (a full token bucket). The level is kept as an integer in units
-- of 1 / (period / g) call, where g = gcd(limit, period): the bucket then
-- drains by exactly limit / g units per µs, so no fraction ever accumulates and
-- 50 calls against a burst of 50 admit exactly 50 (exact while
-- burst * period / g stays below 2^53).

-- The bucket's scale: (rate, unit), the units drained per µs and the units of
-- one call.
local function bucket_scale(p)
  local g = gcd(p.limit, p.period)
  return p.limit / g, p.period / g
end

-- The state under `key` as its two strings (level, stamp), or nil when the key
-- is absent or holds something else.
local function bucket_load(key)
  local value = redis.call('GET', key)
  if not value then
    return nil
  end
  return string.match(value, '^(%d+):(%d+)$')
end

-- The level now of `stored` units stamped `at`, drained by `rate` per µs since;
-- a stamp from the future counts as now.
local function bucket_drained(stored, at, rate)
  local elapsed = math.max(now - tonumber(at), 0)
  return math.max(tonumber(stored) - elapsed * rate, 0)
end

local BUCKET = {
  capacity = 'burst',
  evaluate = function(key, p)
    local rate, unit = bucket_scale(p)
    local level = 0
    local stored, at = bucket_load(key)
    if stored and tonumber(at) > now then
      -- Stamped in the future (a clock behind the one that wrote it):
      -- stamped now, so it flows again from now on.
      redis.call('SET', key, stored .. ':' .. int(now), 'PX', ttl_ms(ceil_div(tonumber(stored), rate)))
      at = int(now)
    end
    if stored then
      level = bucket_drained(stored, at, rate)
    end
    local capacity = p.burst * unit
    local add = p.cost * unit
    local after = level + add
    local admitted = after <= capacity
    local d = {
      admitted = admitted,
      now_remaining = p.burst - ceil_div(level, unit),
      now_reset = ceil_div(level, rate),
      after_remaining = p.burst - ceil_div(after, unit),
      after_reset = ceil_div(after, rate),
      retry = 0,
      write = after,
    }
    if not admitted then
      d.retry = ceil_div(after - capacity, rate)
    end
    return d
  end,
  commit = function(key, p, d)
    redis.call('SET', key, int(d.write) .. ':' .. int(now), 'PX', ttl_ms(d.after_reset))
  end,
  -- Gives back max(0, cost - drained) in the bucket's units, where
  -- drained = rate * (now - at), the drain (leaky) or refill (token) since the
  -- take: counted as if the call's own units went first, which is the most
  -- that can be given back without admitting more than if the call had never
  -- been made, whatever other calls did meanwhile. Never below empty (leaky) or
  -- above full (token); a bucket back to empty / full is deleted.
  refund = function(key, p, r)
    local rate, unit = bucket_scale(p)
    local give = p.cost * unit - (now - r.at) * rate
    if give <= 0 then
      return
    end
    local stored, at = bucket_load(key)
    if not stored then
      return
    end
    local level = bucket_drained(stored, at, rate) - give
    if level <= 0 then
      redis.call('DEL', key)
    else
      redis.call('SET', key, int(level) .. ':' .. int(now), 'PX', ttl_ms(ceil_div(level, rate)))
    end
  end,
}

ALGOS[3] = BUCKET
ALGOS[4] = BUCKET
