-- token bucket (code 4): a bucket of `burst` tokens, full at start, refilled
-- continuously at limit / period (capped at burst); a call takes `cost` tokens
-- when there are enough.
--
-- State: the string "<missing>:<timestamp µs>" (tokens missing from a full
-- bucket), written with its TTL (time until full) in one SET: an absent key is
-- a full bucket. `missing` is an integer in units of 1 / (period / g) token,
-- where g = gcd(limit, period): the refill adds exactly limit / g units per µs,
-- so no fraction ever accumulates (exact while burst * period / g stays below
-- 2^53).
ALGOS[4] = {
  bucket = true,
  evaluate = function(key, p)
    local g = gcd(p.limit, p.period)
    local refill = p.limit / g
    local unit = p.period / g
    local missing = 0
    local value = redis.call('GET', key)
    if value then
      local stored, at = string.match(value, '^(%d+):(%d+)$')
      if stored and tonumber(at) > now then
        -- Stamped in the future (a clock behind the one that wrote it):
        -- stamped now, so it flows again from now on.
        redis.call('SET', key, stored .. ':' .. int(now), 'PX', ttl_ms(ceil_div(tonumber(stored), refill)))
        at = int(now)
      end
      if stored then
        local elapsed = math.max(now - tonumber(at), 0)
        missing = math.max(tonumber(stored) - elapsed * refill, 0)
      end
    end
    local full = p.burst * unit
    local take = p.cost * unit
    local after = missing + take
    -- tokens >= cost  <=>  full - missing >= take
    local admitted = after <= full
    local d = {
      admitted = admitted,
      -- floor(tokens) = burst - ceil(missing / unit)
      now_remaining = p.burst - ceil_div(missing, unit),
      now_reset = ceil_div(missing, refill),
      after_remaining = p.burst - ceil_div(after, unit),
      after_reset = ceil_div(after, refill),
      retry = 0,
      write = after,
    }
    if not admitted then
      -- (cost - tokens) / rate
      d.retry = ceil_div(after - full, refill)
    end
    return d
  end,
  commit = function(key, p, d)
    redis.call('SET', key, int(d.write) .. ':' .. int(now), 'PX', ttl_ms(d.after_reset))
  end,
}
