-- concurrency (code 7): at most `limit` calls in flight per key. A sorted set
-- of the holders' call ids (the driver's call id: `holder`), each scored by
-- the end of its lease in µs (now + period at its take). A lease counts while
-- its end is after now, so a slot that is never released (a killed process)
-- comes back within `period`; the call's release removes its id (`refund`,
-- and the stores' forget: `ZREM key id`). A check without a call id holds an
-- anonymous lease, released only by its end. Ended leases are trimmed only by
-- an admitted call (a rejected call writes nothing), so the set never holds
-- more than `limit` entries after a take. The key expires after its last
-- lease. A refused call's retry is the time until the earliest lease ends,
-- at most CONCURRENCY_RETRY_US (a slot usually comes back sooner, when its
-- holder ends). Mirror of src/algorithm/concurrency.rs.
local CONCURRENCY_RETRY_US = 20000

-- The end of the first live lease of `entries` (a WITHSCORES reply) that is
-- not this call's own, or nil.
local function concurrency_other(entries)
  for j = 1, #entries, 2 do
    if entries[j] ~= holder then
      return tonumber(entries[j + 1])
    end
  end
  return nil
end

ALGOS[7] = {
  capacity = 'limit',
  evaluate = function(key, p)
    local latest = now + p.period
    -- Leases ending more than a period from now were stamped by a clock ahead
    -- of this one: they end a period from now.
    local ahead = redis.call('ZRANGEBYSCORE', key, '(' .. int(latest), '+inf')
    for _, member in ipairs(ahead) do
      redis.call('ZADD', key, 'XX', int(latest), member)
    end
    local n = redis.call('ZCOUNT', key, '(' .. int(now), '+inf')
    -- The same call taken again (a retried script) holds one slot: its own
    -- lease is not counted, and its take renews it.
    if holder ~= nil then
      local own = redis.call('ZSCORE', key, holder)
      if own and tonumber(own) > now then
        n = n - 1
      end
    end
    local first = concurrency_other(redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 2))
    local last = concurrency_other(redis.call('ZREVRANGEBYSCORE', key, '+inf', '(' .. int(now), 'WITHSCORES', 'LIMIT', 0, 2))
    local admitted = n < p.limit
    local d = {
      admitted = admitted,
      now_remaining = p.limit - n,
      now_reset = last and (last - now) or 0,
      after_remaining = p.limit - n - 1,
      after_reset = p.period,
      retry = 0,
      write = n,
    }
    if not admitted then
      d.retry = first and math.min(first - now, CONCURRENCY_RETRY_US) or 0
    end
    return d
  end,
  commit = function(key, p, d)
    local member = holder
    if member == nil then
      member = 'a' .. int(now) .. '.' .. int(redis.call('ZCARD', key))
    end
    -- ZADD before the trim (see sliding.lua: a server at its maxmemory refuses
    -- a script's first write only if that write may grow memory).
    redis.call('ZADD', key, int(now + p.period), member)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
    redis.call('PEXPIREAT', key, int(floor_div(now + p.period, 1000) + 1))
  end,
  -- The release: the call's lease goes, whatever it held.
  refund = function(key, p, r)
    if holder ~= nil then
      redis.call('ZREM', key, holder)
    end
  end,
}
