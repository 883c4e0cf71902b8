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
ALGOS[6] = {
  capacity = 'limit',
  evaluate = function(key, p)
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
    local load = prev * (pms - e) + cur * pms
    local quota = p.limit * pms
    local admitted = load + p.cost * pms <= quota
    local window_end = start + p.period
    local now_reset = 0
    if cur > 0 then
      now_reset = window_end + p.period - now
    elseif prev > 0 then
      now_reset = window_end - now
    end
    local d = {
      admitted = admitted,
      now_remaining = floor_div(math_max(quota - load, 0), pms),
      now_reset = now_reset,
      after_remaining = floor_div(math_max(quota - load - p.cost * pms, 0), pms),
      after_reset = window_end + p.period - now,
      retry = 0,
      write = { index = index, cur = cur + p.cost, prev = prev },
    }
    if not admitted then
      -- The first elapsed ms e at which weight·(P - e) <= room·P.
      local function first_ms(weight, room)
        if weight == 0 then
          return 0
        end
        return math_max(pms - floor_div(room * pms, weight), 0)
      end
      local waited = nil
      if cur + p.cost <= p.limit then
        local at = first_ms(prev, p.limit - cur - p.cost)
        if at < pms then
          waited = start + at * 1000 - now
        end
      end
      if waited == nil then
        -- Next window: this window's count is the previous one's.
        local at = math_min(first_ms(cur, math_max(p.limit - p.cost, 0)), pms)
        waited = window_end + at * 1000 - now
      end
      d.retry = waited
    end
    return d
  end,
  commit = function(key, p, d)
    local w = d.write
    redis_call('SET', key, int(w.index) .. ':' .. int(w.cur) .. ':' .. int(w.prev), 'PX', ttl_ms(d.after_reset))
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
