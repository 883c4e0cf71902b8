-- concurrency (code 7): at most `limit` calls in flight per key. A sorted set
-- of the holders' call ids (the driver's call id: `holder`), each scored by
-- the end of its lease in µs (now + period at its take). A lease counts while
-- its end is after now, so a slot that is never released (a killed process)
-- comes back within `period`; the call's release removes its id (`refund`,
-- and the stores' forget: `ZREM key id`). A check without a call id holds an
-- anonymous lease (a name no lease has), released only by its end. Each
-- check costs O(log num): a count and the two ends of the live range. Ended leases are trimmed only by
-- an admitted call (a rejected call writes nothing), so the set never holds
-- more than `limit` entries after a take. The key expires after its last
-- lease. A refused call's retry is the time until the earliest lease ends,
-- at most CONCURRENCY_RETRY_US (a slot usually comes back sooner, when its
-- holder ends). Mirror of src/algorithm/concurrency.rs.
local CONCURRENCY_RETRY_US = 20000

ALGOS[7] = {
  capacity = 'limit',
  evaluate = function(key, p)
    local latest = now + p.period
    -- O(log n) in the leases whatever their number: a full key is checked
    -- as cheaply as an empty one (a flood of refused checks costs what it
    -- costs on the other algorithms). Leases ending more than a period from
    -- now were stamped by a clock ahead of this one: they end a period from
    -- now (none, but after a failover).
    local ahead = redis_call('ZRANGEBYSCORE', key, '(' .. int(latest), '+inf')
    for j = 1, #ahead do
      redis_call('ZADD', key, int(latest), ahead[j])
    end
    -- The live leases, leaving out this call's own (the same call taken
    -- again, a retried script, holds one slot: its take renews it).
    local n = redis_call('ZCOUNT', key, '(' .. int(now), '+inf')
    local own = holder and redis_call('ZSCORE', key, holder)
    if own and tonumber(own) > now then
      n = n - 1
    end
    -- Their earliest and latest end: of the two lowest and the two highest
    -- leases, the first that is not this call's.
    local first, last = nil, nil
    if n > 0 then
      local low = redis_call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 2)
      for j = 1, #low, 2 do
        if low[j] ~= holder then
          first = tonumber(low[j + 1])
          break
        end
      end
      local high = redis_call('ZRANGE', key, -2, -1, 'WITHSCORES')
      for j = #high - 1, 1, -2 do
        if high[j] ~= holder then
          last = tonumber(high[j + 1])
          break
        end
      end
    end
    local admitted = n < p.limit
    local d = {
      admitted = admitted,
      now_remaining = p.limit - n,
      now_reset = last and (last - now) or 0,
      after_remaining = p.limit - n - 1,
      after_reset = p.period,
      retry = 0,
    }
    if not admitted then
      d.retry = first and math_min(first - now, CONCURRENCY_RETRY_US) or 0
    end
    return d
  end,
  commit = function(key, p, d)
    -- An anonymous lease is named by its time and the first number no lease
    -- of that time has (a lease taken at `now` is live: it ends later).
    local member = holder
    if member == nil then
      local j = 0
      member = 'a' .. int(now) .. '.0'
      while redis_call('ZSCORE', key, member) do
        j = j + 1
        member = 'a' .. int(now) .. '.' .. j
      end
    end
    -- ZADD before the trim (see sliding.lua: a server at its maxmemory refuses
    -- a script's first write only if that write may grow memory). The key
    -- outlives its last lease.
    redis_call('ZADD', key, int(now + p.period), member)
    redis_call('ZREMRANGEBYSCORE', key, '-inf', int(now))
    redis_call('PEXPIRE', key, ttl_ms(p.period + 1000))
  end,
  -- The release: the call's lease goes, whatever it held.
  refund = function(key, p, r)
    if holder ~= nil then
      redis_call('ZREM', key, holder)
    end
  end,
}
