-- concurrency (code 7): at most `limit` calls in flight per key. A sorted set
-- of the holders' call ids (the driver's call id: `holder`), each scored by
-- the end of its lease in µs (now + period at its take). A lease counts while
-- its end is after now, so a slot that is never released (a killed process)
-- comes back within `period`; the call's release removes its id (`refund`,
-- and the stores' forget: `ZREM key id`). A check without a call id holds an
-- anonymous lease (a name no live lease has), released only by its end. Each
-- check reads the live leases whole (at most `limit`: O(num) per check). Ended leases are trimmed only by
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
    -- The live leases (at most `limit` after any take, so read whole): their
    -- count, the earliest and the latest end, leaving out this call's own
    -- lease (the same call taken again, a retried script, holds one slot: its
    -- take renews it). Leases ending more than a period from now were stamped
    -- by a clock ahead of this one: they end a period from now.
    local live = redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf', 'WITHSCORES')
    local n, first, last = 0, nil, nil
    local members = {}
    for j = 1, #live, 2 do
      local member, ends = live[j], tonumber(live[j + 1])
      members[member] = true
      if ends > latest then
        redis.call('ZADD', key, int(latest), member)
        ends = latest
      end
      if member ~= holder then
        n = n + 1
        if first == nil or ends < first then
          first = ends
        end
        if last == nil or ends > last then
          last = ends
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
      write = members,
    }
    if not admitted then
      d.retry = first and math.min(first - now, CONCURRENCY_RETRY_US) or 0
    end
    return d
  end,
  commit = function(key, p, d)
    -- An anonymous lease is named by its time and the first number no live
    -- lease of that time has (a lease taken at `now` is live: it ends later).
    local member = holder
    if member == nil then
      local j = 0
      member = 'a' .. int(now) .. '.0'
      while d.write[member] do
        j = j + 1
        member = 'a' .. int(now) .. '.' .. j
      end
    end
    -- ZADD before the trim (see sliding.lua: a server at its maxmemory refuses
    -- a script's first write only if that write may grow memory). The key
    -- outlives its last lease.
    redis.call('ZADD', key, int(now + p.period), member)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
    redis.call('PEXPIRE', key, ttl_ms(p.period + 1000))
  end,
  -- The release: the call's lease goes, whatever it held.
  refund = function(key, p, r)
    if holder ~= nil then
      redis.call('ZREM', key, holder)
    end
  end,
}
