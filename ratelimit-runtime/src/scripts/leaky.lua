-- leaky bucket (code 3): a bucket of capacity `burst`, empty at start, draining
-- continuously at limit / period; a call adds `cost` if it fits.
--
-- State: the string "<level>:<timestamp µs>", written with its TTL (time until
-- empty) in one SET. The level is kept as an integer in units of
-- 1 / (period / g) call, where g = gcd(limit, period): the bucket then drains by
-- exactly limit / g units per µs, so no fraction ever accumulates and 50 calls
-- against a burst of 50 admit exactly 50 (exact while burst * period / g stays
-- below 2^53).
ALGOS[3] = {
  bucket = true,
  evaluate = function(key, p)
    local g = gcd(p.limit, p.period)
    local drain = p.limit / g
    local unit = p.period / g
    local level = 0
    local value = redis.call('GET', key)
    if value then
      local stored, at = string.match(value, '^(%d+):(%d+)$')
      if stored and tonumber(at) > now then
        -- Stamped in the future (a clock behind the one that wrote it):
        -- stamped now, so it flows again from now on.
        redis.call('SET', key, stored .. ':' .. int(now), 'PX', ttl_ms(ceil_div(tonumber(stored), drain)))
        at = int(now)
      end
      if stored then
        local elapsed = math.max(now - tonumber(at), 0)
        level = math.max(tonumber(stored) - elapsed * drain, 0)
      end
    end
    local capacity = p.burst * unit
    local add = p.cost * unit
    local after = level + add
    local admitted = after <= capacity
    local d = {
      admitted = admitted,
      now_remaining = p.burst - ceil_div(level, unit),
      now_reset = ceil_div(level, drain),
      after_remaining = p.burst - ceil_div(after, unit),
      after_reset = ceil_div(after, drain),
      retry = 0,
      write = after,
    }
    if not admitted then
      d.retry = ceil_div(after - capacity, drain)
    end
    return d
  end,
  commit = function(key, p, d)
    redis.call('SET', key, int(d.write) .. ':' .. int(now), 'PX', ttl_ms(d.after_reset))
  end,
}
