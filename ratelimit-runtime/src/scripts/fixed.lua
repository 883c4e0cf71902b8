-- fixed window (code 1): one string counter whose TTL is the window's end.
--
-- The window starts at the first ADMITTED call and lasts `period`: it is created
-- by `SET key cost PXAT ⌊now / 1 ms⌋ + period` (value and TTL in one command, so
-- the counter can never be left immortal) and later calls `INCRBY` it, which keeps the TTL; the
-- TTL is never moved. A rejected call writes nothing.

ALGOS[1] = {
  capacity = 'limit',
  evaluate = function(key, p)
    local count = 0
    local left_us = 0
    local live = false
    local value = redis_call('GET', key)
    if value then
      -- The window's end as stored (the prelude's expiry_ms), not as PTTL counts
      -- it: PTTL runs on the live clock, so a server paused mid-script would read
      -- the end early, and this call's refund (which checks that the window is
      -- still the one the call took from) would be refused.
      local at = expiry_ms(key)
      -- A counter without a TTL (written by someone else) is treated as no
      -- window: an admitted call replaces it with a fresh one. A key exists
      -- through its expiry millisecond, and a script's clock is frozen, so it
      -- cannot vanish before the INCRBY.
      if at then
        -- A window can never have more than a period left: a longer TTL was
        -- stamped by a clock ahead of this one (a failover). Treated as a
        -- window that started now.
        local latest = floor_div(now, 1000) + ceil_div(p.period, 1000)
        if at > latest then
          redis_call('PEXPIREAT', key, int(latest))
          at = latest
        end
        -- Only a counter INCRBY can raise (digits): anything else under the key
        -- (written by someone else) is no window, replaced by the next SET.
        local n = string_match(value, '^%d+$') and tonumber(value)
        if n then
          live = true
          count = n
          left_us = math_min(left_until(at), p.period + 1000)
        end
      end
    end
    local admitted = count + p.cost <= p.limit
    local d = {
      admitted = admitted,
      now_remaining = p.limit - count,
      now_reset = left_us,
      after_remaining = p.limit - count - p.cost,
      after_reset = live and left_us or p.period + 1000 - math_fmod(now, 1000),
      retry = 0,
      write = live,
    }
    if not admitted then
      d.retry = left_us
    end
    return d
  end,
  commit = function(key, p, d)
    if d.write then
      -- A settle's excess comes with its own cost and no text (refund.lua).
      redis_call('INCRBY', key, p.cost_text or int(p.cost))
    else
      -- PXAT from the script's clock, not PX: Redis 7.0 adds a PX to its live
      -- clock, which runs on while the script does, so a server paused between
      -- TIME and this SET would end the window later than the call's receipt
      -- says and its refund would be refused.
      redis_call('SET', key, p.cost_text or int(p.cost), 'PXAT', int(math_floor(now / 1000) + p.period / 1000))
    end
  end,
  -- DECRBY cost only while the call's window is still the key's: the server's
  -- time is more than 2 ms before that window's end (at + reset_after; the
  -- margin covers the expiry's millisecond resolution, so a refund at the very edge
  -- gives back nothing) and the key's window ends no later than 2 ms after it
  -- (a newer window, opened after a lost write, ends later). A window left
  -- empty is deleted, as if the call had never opened it.
  refund = function(key, p, r)
    local window_end = r.at + r.reset
    if now + 2000 >= window_end then
      return
    end
    local value = redis_call('GET', key)
    if not value then
      return
    end
    local n = string_match(value, '^%d+$') and tonumber(value)
    local at = expiry_ms(key)
    if not n or not at then
      return
    end
    -- When the key's window ends, as evaluate reckons it (never early).
    if now + left_until(at) > window_end + 2000 then
      return
    end
    if n <= p.cost then
      redis_call('DEL', key)
    else
      redis_call('DECRBY', key, int(p.cost))
    end
  end,
}
