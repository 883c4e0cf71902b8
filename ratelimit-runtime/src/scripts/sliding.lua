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

-- The log under `key` now for a call of `p`: the floor (entries above it are
-- live), the live entries' count, the newest entry's score (nil: none) and the
-- score the call's first entry would get. A log stamped ahead of this clock is
-- shifted to end now first (the one write a rejected call can make). The
-- rule's one home in Lua with sliding_retry and sliding_write: evaluate and
-- commit read them for the driver, check_one for a call of this limit alone.
local function sliding_state(key, p)
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
  local first = now
  if newest ~= nil and newest >= now then
    first = newest + 1
  end
  return floor, n, newest, first
end

-- µs until a call of `p` that does not fit a log of `n` live entries above
-- `floor` would: when the (n + cost - limit)-th oldest live entry expires.
local function sliding_retry(key, p, floor, n)
  local k = n + p.cost - p.limit
  local entry = redis_call('ZRANGEBYSCORE', key, '(' .. int(floor), '+inf', 'WITHSCORES', 'LIMIT', int(k - 1), 1)
  return math_max(tonumber(entry[2]) + p.period - now, 0)
end

-- Takes a call of `p` whose entries start at score `first`, and trims the
-- entries at or below `floor`; the key lives until its newest entry expires.
local function sliding_write(key, p, floor, first)
  -- ZADD before the trim: a server at its maxmemory (noeviction) refuses a script's
  -- first write only if that write may grow memory, so the ZADD must come first
  -- (after a trim it would be let through, and a flood of sliding keys would grow
  -- the server past its maxmemory). The new entries are all above the floor.
  -- ZADD in batches: `unpack` is bounded by Lua's C stack. A call of cost 1,
  -- the usual one, needs no table of arguments.
  if p.cost == 1 then
    local score = int(first)
    redis_call('ZADD', key, score, score)
  else
    local i = 0
    while i < p.cost do
      local args = {}
      local last = math_min(i + 500, p.cost)
      while i < last do
        local score = int(first + i)
        args[#args + 1] = score
        args[#args + 1] = score
        i = i + 1
      end
      redis_call('ZADD', key, unpack(args))
    end
  end
  redis_call('ZREMRANGEBYSCORE', key, '-inf', int(floor))
  redis_call('PEXPIRE', key, ttl_ms(first + p.cost - 1 + p.period - now))
end

ALGOS[2] = {
  capacity = 'limit',
  evaluate = function(key, p)
    local floor, n, newest, first = sliding_state(key, p)
    local admitted = n + p.cost <= p.limit
    local d = {
      admitted = admitted,
      now_remaining = p.limit - n,
      now_reset = newest and math_max(newest + p.period - now, 0) or 0,
      after_remaining = p.limit - n - p.cost,
      after_reset = first + p.cost - 1 + p.period - now,
      retry = 0,
      write = floor,
      first = first,
    }
    if not admitted then
      d.retry = sliding_retry(key, p, floor, n)
    end
    return d
  end,
  commit = function(key, p, d)
    sliding_write(key, p, d.write, d.first)
  end,
  -- The driver's one-limit call (see there), decided and answered here as the
  -- driver answers it from evaluate and commit, without the decision's table.
  check_one = function(key, l)
    local p = l.p
    local floor, n, newest, first = sliding_state(key, p)
    if not (n + p.cost <= p.limit) then
      return { 0, clamp(p.limit - n, l.capacity),
        clamp(newest and math_max(newest + p.period - now, 0) or 0),
        clamp(sliding_retry(key, p, floor, n)) }
    end
    sliding_write(key, p, floor, first)
    return taken_row_now(clamp(p.limit - n - p.cost, l.capacity),
      clamp(first + p.cost - 1 + p.period - now), clamp(first))
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
