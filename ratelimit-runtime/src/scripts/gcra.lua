-- GCRA (code 5): the token bucket of capacity `burst`, one unit per emission
-- interval T = period / num µs (rounded up), kept as one integer: the
-- theoretical arrival time `tat` (µs), when the backlog ends and the bucket is
-- full again. A call of `cost` fits when max(tat, now) + cost·T - now is at
-- most the burst tolerance burst·T; it then moves tat there.
--
-- State: the string "<tat µs>" with TTL tat - now (a key is gone exactly when
-- its bucket is full again). A tat further ahead than a full backlog was
-- stamped by a clock ahead of this one: brought back to a full backlog from
-- now. Mirror of src/algorithm/gcra.rs.
local function gcra_interval(p)
  local t = ceil_div(p.period, p.limit)
  if t < 1 then
    t = 1
  end
  return t
end

ALGOS[5] = {
  capacity = 'burst',
  evaluate = function(key, p)
    local t = gcra_interval(p)
    local tau = p.burst * t
    local start = now
    local value = redis.call('GET', key)
    local tat = value and tonumber(value)
    if tat then
      if tat > now + tau then
        tat = now + tau
        redis.call('SET', key, int(tat), 'PX', ttl_ms(tat - now))
      end
      if tat > now then
        start = tat
      end
    end
    local backlog = start - now
    local after = backlog + p.cost * t
    local admitted = after <= tau
    local d = {
      admitted = admitted,
      now_remaining = p.burst - ceil_div(backlog, t),
      now_reset = backlog,
      after_remaining = p.burst - ceil_div(after, t),
      after_reset = after,
      retry = 0,
      write = now + after,
    }
    if not admitted then
      d.retry = after - tau
    end
    return d
  end,
  commit = function(key, p, d)
    redis.call('SET', key, int(d.write), 'PX', ttl_ms(d.after_reset))
  end,
  -- Gives back what the call still holds: cost·T less the time gone since the
  -- take (the part of its backlog not yet worked off). A bucket full again is
  -- deleted.
  refund = function(key, p, r)
    local give = p.cost * gcra_interval(p) - (now - r.at)
    if give <= 0 then
      return
    end
    local value = redis.call('GET', key)
    local tat = value and tonumber(value)
    if not tat then
      return
    end
    local back = tat - give
    if back <= now then
      redis.call('DEL', key)
    else
      redis.call('SET', key, int(back), 'PX', ttl_ms(back - now))
    end
  end,
}
