-- GCRA (code 5): the token bucket of capacity `burst`, one unit per emission
-- interval T = period / num µs (rounded up), kept as one integer: the
-- theoretical arrival time `tat` (µs), when the backlog ends and the bucket is
-- full again. A call of `cost` fits when max(tat, now) + cost·T - now is at
-- most the burst tolerance burst·T; it then moves tat there.
--
-- State: tat lives in the key's expiry. The key expires at the millisecond
-- after tat's (PXAT ⌊tat / 1000⌋ + 1, always ahead of now) and its value is
-- only tat's microseconds within its millisecond (0 to 999): a small integer,
-- which Redis shares instead of allocating, so a GCRA key costs no more memory
-- than a fixed window's counter. A key is gone when its bucket is full again
-- (at most 2 ms later). A tat further ahead than a full backlog was stamped by
-- a clock ahead of this one: brought back to a full backlog from now. Mirror
-- of src/algorithm/gcra.rs.

-- The tat under `key`, or nil: the expiry millisecond less one (the
-- prelude's expiry_ms), in µs, plus the stored microseconds.
local function gcra_read(key)
  local value = redis_call('GET', key)
  local us = value and tonumber(value)
  if not us then
    return nil
  end
  local at = expiry_ms(key)
  if not at then
    return nil
  end
  return (at - 1) * 1000 + us
end

-- Writes `tat` (ahead of now) as gcra_read reads it.
local function gcra_write(key, tat)
  local ms = floor_div(tat, 1000)
  redis_call('SET', key, int(tat - ms * 1000), 'PXAT', int(ms + 1))
end

local function gcra_interval(p)
  local t = ceil_div(p.period, p.limit)
  if t < 1 then
    t = 1
  end
  return t
end

-- GCRA's decision on `key` for a call of `p` now: the emission interval T, the
-- tolerance tau = burst·T, the backlog before the call and after it (the call
-- fits when after <= tau). A tat further ahead than a full backlog is brought
-- back to a full backlog from now first (the one write a rejected call can
-- make). The rule's one home in Lua: evaluate reads it for the driver, check_one
-- for a call of this limit alone.
local function gcra_decide(key, p)
  local t = gcra_interval(p)
  local tau = p.burst * t
  local start = now
  local tat = gcra_read(key)
  if tat then
    if tat > now + tau then
      tat = now + tau
      gcra_write(key, tat)
    end
    if tat > now then
      start = tat
    end
  end
  local backlog = start - now
  return t, tau, backlog, backlog + p.cost * t
end

ALGOS[5] = {
  capacity = 'burst',
  evaluate = function(key, p)
    local t, tau, backlog, after = gcra_decide(key, p)
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
  -- The driver's one-limit call (see there), decided and answered here as the
  -- driver answers it from evaluate and commit, without the decision's table.
  check_one = function(key, l)
    local p = l.p
    local t, tau, backlog, after = gcra_decide(key, p)
    if not (after <= tau) then
      return { 0, clamp(p.burst - ceil_div(backlog, t), l.capacity), clamp(backlog),
        clamp(after - tau) }
    end
    gcra_write(key, now + after)
    return taken_row_now(clamp(p.burst - ceil_div(after, t), l.capacity), clamp(after), 0)
  end,
  commit = function(key, p, d)
    gcra_write(key, d.write)
  end,
  -- Gives back what the call still holds: cost·T less the time gone since the
  -- take (the part of its backlog not yet worked off). A bucket full again is
  -- deleted.
  refund = function(key, p, r)
    local give = p.cost * gcra_interval(p) - (now - r.at)
    if give <= 0 then
      return
    end
    local tat = gcra_read(key)
    if not tat then
      return
    end
    local back = tat - give
    if back <= now then
      redis_call('DEL', key)
    else
      gcra_write(key, back)
    end
  end,
}
