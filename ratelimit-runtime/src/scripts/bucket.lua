-- token bucket (code 4) and leaky bucket (code 3): one rule under two names.
--
-- A bucket of capacity `burst` holds a level that drains continuously at
-- limit / period; a call raises it by `cost` when the result fits under
-- `burst`. For the leaky bucket the level is what is in the bucket (empty at
-- start, a call adds `cost` if it fits); for the token bucket it is the tokens
-- MISSING from a full bucket of `burst` tokens (full at start, refilled at
-- limit / period up to `burst`, a call takes `cost` tokens when there are
-- enough). The arithmetic is the same:
--   tokens >= cost         <=>  full - missing >= take  <=>  after <= full
--   floor(tokens)          =    burst - ceil(missing / unit)
--   retry (cost - tokens) / rate = (after - full) / rate
--
-- State: the level L (units of 1 / (period / g) call, where g = gcd(limit,
-- period)) drains by exactly limit / g units per µs, so no fraction ever
-- accumulates and 50 calls against a burst of 50 admit exactly 50. A level L at
-- `now` is the integer E = now * rate + L, "empty at" in units of 1 / rate µs,
-- never formed here (it passes 2^53): the key expires at the millisecond after
-- the one E falls in (PXAT m + 1, always ahead of now while L > 0) and its value
-- is v = E - m * 1000 * rate, below 1000 * rate (the level at the start of
-- millisecond m): one integer, as GCRA keeps its tat. An absent key is an empty
-- bucket (a full token bucket). A level above a full bucket plus one capacity
-- of settled debt was written by a clock ahead of this one (a failover to a
-- replica behind): brought back to that, from now (fails closed, bounded).
-- Exact while burst * period / g and 1000 * limit / g stay within 2^52 (the
-- policy bounds). Mirror of src/algorithm/bucket.rs.

-- The bucket's scale: (rate, unit), the units drained per µs and the units of
-- one call.
local function bucket_scale(p)
  local g = gcd(p.limit, p.period)
  return p.limit / g, p.period / g
end

-- The level now under `key`, whose GET read `value` (nil: absent): 0 when
-- absent; else ((m * 1000 - now) * rate + v) with m the expiry millisecond
-- less one, at least 0. A value that is not a plain integer may be the earlier
-- form, "<level>:<stamp µs>", read for one window after an upgrade (a
-- stamp from the future counts as now), then `true`: evaluate rewrites it in
-- the new form; anything else is an empty bucket.
local function bucket_level(key, value, rate)
  if not value then
    return 0
  end
  local v = tonumber(value)
  if not v then
    local stored, at = string_match(value, '^(%d+):(%d+)$')
    if not stored then
      return 0
    end
    return math_max(tonumber(stored) - math_max(now - tonumber(at), 0) * rate, 0), true
  end
  local ms = expiry_ms(key)
  if not ms then
    return 0
  end
  return math_max(((ms - 1) * 1000 - now) * rate + v, 0)
end

-- Writes a level of `level` units (> 0) at now, as bucket_level reads it:
-- w = (now mod 1000) * rate + level, E less the start of now's millisecond.
local function bucket_write(key, level, rate)
  local per_ms = 1000 * rate
  local w = math_fmod(now, 1000) * rate + level
  local ms = floor_div(w, per_ms)
  redis_call('SET', key, int(w - ms * per_ms), 'PXAT', int(floor_div(now, 1000) + ms + 1))
end

-- The bucket's decision on `key` for a call of `p` now: its scale (rate,
-- unit), its capacity in units, the level before the call and after it (the
-- call fits when after <= capacity). A level above a full bucket and one
-- capacity of debt (written by a clock ahead of this one) is brought back to
-- that from now, and the earlier form rewritten, first: the one write a
-- rejected call can make. The rule's one home in Lua: evaluate reads it for
-- the driver, check_one for a call of this limit alone.
local function bucket_decide(key, p)
  local rate, unit = bucket_scale(p)
  local value = redis_call('GET', key)
  local level, old = bucket_level(key, value, rate)
  local capacity = p.burst * unit
  if level > 2 * capacity then
    -- Above a full bucket and one capacity of debt: written by a clock ahead
    -- of this one. Brought back to that from now, never held longer.
    level = 2 * capacity
    bucket_write(key, level, rate)
  elseif old then
    -- The earlier form (its stamp maybe ahead, counted as now): rewritten.
    if level > 0 then
      bucket_write(key, level, rate)
    else
      redis_call('DEL', key)
    end
  end
  return rate, unit, capacity, level, level + p.cost * unit
end

local BUCKET = {
  capacity = 'burst',
  evaluate = function(key, p)
    local rate, unit, capacity, level, after = bucket_decide(key, p)
    local admitted = after <= capacity
    local d = {
      admitted = admitted,
      now_remaining = p.burst - ceil_div(level, unit),
      now_reset = ceil_div(level, rate),
      after_remaining = p.burst - ceil_div(after, unit),
      after_reset = ceil_div(after, rate),
      retry = 0,
      write = after,
      rate = rate,
    }
    if not admitted then
      d.retry = ceil_div(after - capacity, rate)
    end
    return d
  end,
  -- The driver's one-limit call (see there), decided and answered here as the
  -- driver answers it from evaluate and commit, without the decision's table.
  check_one = function(key, l)
    local p = l.p
    local rate, unit, capacity, level, after = bucket_decide(key, p)
    if not (after <= capacity) then
      return { 0, clamp(p.burst - ceil_div(level, unit), l.capacity),
        clamp(ceil_div(level, rate)), clamp(ceil_div(after - capacity, rate)) }
    end
    bucket_write(key, after, rate)
    return taken_row_now(clamp(p.burst - ceil_div(after, unit), l.capacity),
      clamp(ceil_div(after, rate)), 0)
  end,
  commit = function(key, p, d)
    bucket_write(key, d.write, d.rate)
  end,
  -- Gives back max(0, cost - drained) in the bucket's units, where
  -- drained = rate * (now - at), the drain (leaky) or refill (token) since the
  -- take: counted as if the call's own units went first, which is the most
  -- that can be given back without admitting more than if the call had never
  -- been made, whatever other calls did meanwhile. Never below empty (leaky) or
  -- above full (token); a bucket back to empty / full is deleted.
  refund = function(key, p, r)
    local rate, unit = bucket_scale(p)
    local give = p.cost * unit - (now - r.at) * rate
    if give <= 0 then
      return
    end
    local value = redis_call('GET', key)
    if not value then
      return
    end
    local level = bucket_level(key, value, rate) - give
    if level <= 0 then
      redis_call('DEL', key)
    else
      bucket_write(key, level, rate)
    end
  end,
}

ALGOS[3] = BUCKET
ALGOS[4] = BUCKET
