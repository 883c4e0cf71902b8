-- fixed window (code 1): one string counter whose TTL is the window's end.
--
-- The window starts at the first ADMITTED call and lasts `period`: it is created
-- by `SET key cost PX period` (value and TTL in one command, so the counter can
-- never be left immortal) and later calls `INCRBY` it, which keeps the TTL; the
-- TTL is never moved. A rejected call writes nothing.
ALGOS[1] = {
  evaluate = function(key, p)
    local count = 0
    local left_us = 0
    local live = false
    local value = redis.call('GET', key)
    if value then
      local pttl = redis.call('PTTL', key)
      -- A counter without a TTL (written by someone else) is treated as no
      -- window: an admitted call replaces it with a fresh one. A key exists
      -- through its expiry millisecond (PTTL 0), and a script's clock is frozen,
      -- so it cannot vanish before the INCRBY.
      if pttl >= 0 then
        -- A window can never have more than a period left: a longer TTL was
        -- stamped by a clock ahead of this one (a failover). Treated as a
        -- window that started now.
        local period_ms = ceil_div(p.period, 1000)
        if pttl > period_ms then
          redis.call('PEXPIRE', key, int(period_ms))
          pttl = period_ms
        end
        local n = tonumber(value)
        if n ~= nil and n >= 0 then
          live = true
          count = n
          -- The key is gone once the clock passes its expiry millisecond: at
          -- now_ms + pttl + 1 ms, i.e. (pttl + 1) ms less the part of the
          -- current millisecond already gone (rounded up, never early).
          left_us = math.min(pttl * 1000 + 1000 - math.fmod(now, 1000), p.period + 1000)
        end
      end
    end
    local admitted = count + p.cost <= p.limit
    local d = {
      admitted = admitted,
      now_remaining = p.limit - count,
      now_reset = left_us,
      after_remaining = p.limit - count - p.cost,
      after_reset = live and left_us or p.period + 1000 - math.fmod(now, 1000),
      retry = 0,
      write = live,
    }
    if not admitted then
      d.retry = left_us
    end
    return d
  end,
  commit = function(key, p, d)
    if d.write then
      redis.call('INCRBY', key, int(p.cost))
    else
      redis.call('SET', key, int(p.cost), 'PX', int(p.period / 1000))
    end
  end,
}
