-- sliding log (code 2): a sorted set of admission times (score = µs).
--
-- Admitted calls are the entries t with now - period < t. Scores strictly
-- increase (a call in the same µs as the newest entry is written at newest + 1
-- µs) and the member is the score as a string, so two calls in the same
-- millisecond, or microsecond, are two entries. Expired entries are trimmed
-- only by an admitted call (a rejected call writes nothing), so the set never
-- holds more than `limit` entries. The TTL is newest + period.

-- Rewrites every entry `delta` µs earlier (members follow their scores), so
-- that a log stamped in the future ends now; order and spacing are kept.
local function sliding_shift(key, delta)
  local entries = redis_call('ZRANGE', key, 0, -1, 'WITHSCORES')
  redis_call('DEL', key)
  local args = {}
  for j = 2, #entries, 2 do
    local score = int(tonumber(entries[j]) - delta)
    args[#args + 1] = score
    args[#args + 1] = score
    if #args >= 1000 or j == #entries then
      redis_call('ZADD', key, unpack(args))
      args = {}
    end
  end
  return #entries / 2
end

ALGOS[2] = {
  capacity = 'limit',
  evaluate = function(key, p)
    local floor = now - p.period
    local n = redis_call('ZCOUNT', key, '(' .. int(floor), '+inf')
    local newest = nil
    if n > 0 then
      local last = redis_call('ZRANGE', key, -1, -1, 'WITHSCORES')
      newest = tonumber(last[2])
      -- Calls within one µs are written a µs apart, so a healthy log ends at
      -- most `limit` µs after now. Further out, it was stamped by a clock
      -- ahead of this one (a failover): treated as ending now.
      if newest > now + p.limit then
        if sliding_shift(key, newest - now) > 0 then
          redis_call('PEXPIRE', key, ttl_ms(p.period))
        end
        n = redis_call('ZCOUNT', key, '(' .. int(floor), '+inf')
        newest = now
      end
    end
    local admitted = n + p.cost <= p.limit
    local first = now
    if newest ~= nil and newest >= now then
      first = newest + 1
    end
    local after_newest = first + p.cost - 1
    local d = {
      admitted = admitted,
      now_remaining = p.limit - n,
      now_reset = newest and math_max(newest + p.period - now, 0) or 0,
      after_remaining = p.limit - n - p.cost,
      after_reset = after_newest + p.period - now,
      retry = 0,
      write = { floor = floor, newest = after_newest },
      first = first,
    }
    if not admitted then
      -- The call fits once the (n + cost - limit)-th oldest live entry expires.
      local k = n + p.cost - p.limit
      local entry = redis_call('ZRANGEBYSCORE', key, '(' .. int(floor), '+inf', 'WITHSCORES', 'LIMIT', int(k - 1), 1)
      d.retry = math_max(tonumber(entry[2]) + p.period - now, 0)
    end
    return d
  end,
  commit = function(key, p, d)
    local w = d.write
    -- ZADD before the trim: a server at its maxmemory (noeviction) refuses a script's
    -- first write only if that write may grow memory, so the ZADD must come first
    -- (after a trim it would be let through, and a flood of sliding keys would grow
    -- the server past its maxmemory). The new entries are all above the floor.
    -- ZADD in batches: `unpack` is bounded by Lua's C stack. A call of cost 1,
    -- the usual one, needs no table of arguments.
    if p.cost == 1 then
      local score = int(d.first)
      redis_call('ZADD', key, score, score)
    else
      local i = 0
      while i < p.cost do
        local args = {}
        local last = math_min(i + 500, p.cost)
        while i < last do
          local score = int(d.first + i)
          args[#args + 1] = score
          args[#args + 1] = score
          i = i + 1
        end
        redis_call('ZADD', key, unpack(args))
      end
    end
    redis_call('ZREMRANGEBYSCORE', key, '-inf', int(w.floor))
    redis_call('PEXPIRE', key, ttl_ms(w.newest + p.period - now))
  end,
  -- Removes exactly the call's own entries (scores first .. first+cost-1),
  -- never another caller's: scores strictly increase, so no other entry ever
  -- has one of those scores. Once they have expired the call holds nothing and
  -- nothing changes.
  refund = function(key, p, r)
    if r.first < 1 then
      return
    end
    redis_call('ZREMRANGEBYSCORE', key, int(r.first), int(r.first + p.cost - 1))
  end,
}
