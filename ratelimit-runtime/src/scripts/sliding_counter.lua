-- sliding-window counter (code 6): the current and the previous fixed
-- window's counts, the previous weighted by its share of the trailing
-- interval. Windows are aligned on the server's clock: window i is
-- [i·period, (i+1)·period). With P the period and e the time elapsed in the
-- current window, both in whole ms (e rounded down, so the previous window
-- weighs at least its true share), a call fits when
--   prev·(P - e) + (cur + cost)·P <= num·P.
-- Approximate: never more than num in one aligned window, up to 2·num in a
-- trailing interval in the worst case (see src/algorithm/sliding_counter.rs,
-- its mirror).
--
-- State: the string "<window>:<cur>:<prev>" with a TTL to the end of the next
-- window, when `cur` stops weighing. Counters of a window ahead of this
-- clock's count as the current window's.

-- The counters under `key` now for a call of `p`: the current window's index
-- and start, its count and the previous window's, the period in ms (P), and
-- the load and the quota (both in call·ms: the call fits when load + cost·P
-- <= quota). Counters of a window ahead of this clock are rewritten as the
-- current window's first (the one write a rejected call can make). The rule's
-- one home in Lua with counter_reset, counter_retry and counter_write:
-- evaluate and commit read them for the driver, check_one for a call of this
-- limit alone.
local function counter_state(key, p)
  local index = floor_div(now, p.period)
  local start = index * p.period
  local cur, prev = 0, 0
  local value = redis_call('GET', key)
  if value then
    local w, c, q = string_match(value, '^(%d+):(%d+):(%d+)$')
    if w then
      w, c, q = tonumber(w), tonumber(c), tonumber(q)
      if w > index then
        w = index
        redis_call('SET', key, int(w) .. ':' .. int(c) .. ':' .. int(q), 'PX', ttl_ms((w + 2) * p.period - now))
      end
      if w == index then
        cur, prev = c, q
      elseif w + 1 == index then
        prev = c
      end
    end
  end
  local pms = p.period / 1000
  local e = floor_div(now - start, 1000)
  return index, start, cur, prev, pms, prev * (pms - e) + cur * pms, p.limit * pms
end

-- µs until the counters weigh nothing: the end of the next window while the
-- current one counts, else the end of this one while the previous counts.
local function counter_reset(p, start, cur, prev)
  if cur > 0 then
    return start + 2 * p.period - now
  elseif prev > 0 then
    return start + p.period - now
  end
  return 0
end

-- The first elapsed ms e of a window (of P = pms ms) at which
-- weight·(P - e) <= room·P.
local function counter_first_ms(pms, weight, room)
  if weight == 0 then
    return 0
  end
  return math_max(pms - floor_div(room * pms, weight), 0)
end

-- µs until a call of `p` that does not fit would: later in this window, once
-- the previous window weighs little enough, or else in the next one, where
-- this window's count is the previous one's.
local function counter_retry(p, start, cur, prev, pms)
  if cur + p.cost <= p.limit then
    local at = counter_first_ms(pms, prev, p.limit - cur - p.cost)
    if at < pms then
      return start + at * 1000 - now
    end
  end
  local at = math_min(counter_first_ms(pms, cur, math_max(p.limit - p.cost, 0)), pms)
  return start + p.period + at * 1000 - now
end

-- Writes the counters of window `index` (`cur`, `prev`), to live `reset` µs.
local function counter_write(key, index, cur, prev, reset)
  redis_call('SET', key, int(index) .. ':' .. int(cur) .. ':' .. int(prev), 'PX', ttl_ms(reset))
end

ALGOS[6] = {
  capacity = 'limit',
  evaluate = function(key, p)
    local index, start, cur, prev, pms, load, quota = counter_state(key, p)
    local admitted = load + p.cost * pms <= quota
    local d = {
      admitted = admitted,
      now_remaining = floor_div(math_max(quota - load, 0), pms),
      now_reset = counter_reset(p, start, cur, prev),
      after_remaining = floor_div(math_max(quota - load - p.cost * pms, 0), pms),
      after_reset = start + 2 * p.period - now,
      retry = 0,
      write = { index = index, cur = cur + p.cost, prev = prev },
    }
    if not admitted then
      d.retry = counter_retry(p, start, cur, prev, pms)
    end
    return d
  end,
  commit = function(key, p, d)
    local w = d.write
    counter_write(key, w.index, w.cur, w.prev, d.after_reset)
  end,
  -- The driver's one-limit call (see there), decided and answered here as the
  -- driver answers it from evaluate and commit, without the decision's table.
  check_one = function(key, l)
    local p = l.p
    local index, start, cur, prev, pms, load, quota = counter_state(key, p)
    if not (load + p.cost * pms <= quota) then
      return { 0, clamp(floor_div(math_max(quota - load, 0), pms), l.capacity),
        clamp(counter_reset(p, start, cur, prev)),
        clamp(counter_retry(p, start, cur, prev, pms)) }
    end
    local reset = start + 2 * p.period - now
    counter_write(key, index, cur + p.cost, prev, reset)
    return taken_row_now(
      clamp(floor_div(math_max(quota - load - p.cost * pms, 0), pms), l.capacity), clamp(reset), 0)
  end,
  -- Gives back exactly the call's units, from the window it was counted in
  -- (found from the take's time), while that window still counts.
  refund = function(key, p, r)
    local value = redis_call('GET', key)
    if not value then
      return
    end
    local w, c, q = string_match(value, '^(%d+):(%d+):(%d+)$')
    if not w then
      return
    end
    w, c, q = tonumber(w), tonumber(c), tonumber(q)
    local taken_in = floor_div(r.at, p.period)
    if w == taken_in then
      c = math_max(c - p.cost, 0)
    elseif w == taken_in + 1 then
      q = math_max(q - p.cost, 0)
    else
      return
    end
    if c == 0 and q == 0 then
      redis_call('DEL', key)
    else
      local ttl = redis_call('PTTL', key)
      if ttl < 1 then
        ttl = 1
      end
      redis_call('SET', key, int(w) .. ':' .. int(c) .. ':' .. int(q), 'PX', ttl)
    end
  end,
}
