-- ratelimit: peek and refund, for Redis Cluster calls whose limits fall in
-- several slots (store/cluster.rs). Appended to the prelude and the four
-- algorithms instead of the driver.
--
--   peek    KEYS: the call's n keys. ARGV: 'peek', then the driver's 5
--           arguments per key (algorithm code, limit, period µs, burst, cost).
--           Reads only: the state of each limit now, for limits of the call
--           that were never checked because another slot rejected first.
--   refund  KEYS: the n keys, then their n receipts (receipt i is
--           `<KEYS[i]>:r:<id>:<i>`, as the driver wrote it when it admitted
--           this group under the call id). ARGV: 'refund', the call id, then 5
--           arguments per key, in the order of the take. Gives back what the
--           take of this call still holds, then reads the state as peek does.
--
-- The reply is the driver's rejected-call reply: per key {admitted (0/1),
-- remaining, reset_after µs, retry_after µs}.
--
-- A refund is judged by the server's own time, never by a delay measured on a
-- client, and gives back at most what the call still holds:
--   * It reads and DELETES the call's receipt "<at µs>:<reset_after µs>:<first
--     µs>" (the server's time at the take, the limit's reset_after after it,
--     the first sliding entry). A refund sent twice (the cluster client retries
--     a script after a timeout, although the first attempt ran) finds no
--     receipt the second time and gives back nothing; so does a refund that
--     arrives after the receipt expired (its TTL is the longest the call can
--     hold anything of the limit), or on a server whose clock reads earlier
--     than the take's (a failover to a replica whose clock is behind: how long
--     the call has held its units is then unknown).
--   * fixed    DECRBY cost only while the call's window is still the key's:
--              the server's time is more than 2 ms before that window's end
--              (at + reset_after; the margin covers PTTL's millisecond
--              resolution, so a refund at the very edge gives back nothing)
--              and the key's window ends no later than 2 ms after it (a newer
--              window, opened after a lost write, ends later). A window left
--              empty is deleted, as if the call had never opened it.
--   * sliding  removes exactly the call's own entries (scores first ..
--              first+cost-1), never another caller's: scores strictly
--              increase, so no other entry ever has one of those scores. Once
--              they have expired the call holds nothing and nothing changes.
--   * leaky / token  give back max(0, cost - drained) in the bucket's units,
--              where drained = rate * (now - at), the drain (leaky) or refill
--              (token) since the take: counted as if the call's own units went
--              first, which is the most that can be given back without
--              admitting more than if the call had never been made, whatever
--              other calls did meanwhile. Never below empty (leaky) or above
--              full (token); a bucket back to empty / full is deleted.
local mode = ARGV[1]
local call_id = nil
local base = 1
local nkeys = #KEYS
if mode == 'refund' then
  call_id = ARGV[2]
  base = 2
  nkeys = #KEYS / 2
end
if (mode ~= 'peek' and mode ~= 'refund') or nkeys < 1 or nkeys ~= math.floor(nkeys)
  or #ARGV ~= base + 5 * nkeys then
  return redis.error_reply('ERR ratelimit: expected peek with n keys and 1 + 5n arguments, or refund with n keys, n receipts and 2 + 5n arguments; got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
if call_id ~= nil and (#call_id < 1 or #call_id > 32 or string.find(call_id, '[^0-9a-f]')) then
  return redis.error_reply('ERR ratelimit: the call id must be 1 to 32 hex digits')
end

local limits = {}
for i = 1, nkeys do
  local at = base + 5 * (i - 1)
  local code = tonumber(ARGV[at + 1])
  local algo = ALGOS[code]
  if algo == nil then
    return redis.error_reply('ERR ratelimit: this script has no algorithm with code ' .. tostring(ARGV[at + 1]))
  end
  local p = {
    limit = tonumber(ARGV[at + 2]),
    period = tonumber(ARGV[at + 3]),
    burst = tonumber(ARGV[at + 4]),
    cost = tonumber(ARGV[at + 5]),
  }
  if not (p.limit and p.period and p.burst and p.cost)
    or p.limit < 1 or p.period < 1000 or p.burst < 1 or p.cost < 1 then
    return redis.error_reply('ERR ratelimit: invalid parameters for key ' .. i)
  end
  if call_id ~= nil and KEYS[nkeys + i] ~= KEYS[i] .. ':r:' .. call_id .. ':' .. i then
    return redis.error_reply('ERR ratelimit: receipt ' .. i .. ' is not the receipt of key ' .. i .. ' for this call id')
  end
  limits[i] = { code = code, algo = algo, p = p }
end

-- A whole, non-negative number (as the driver replies).
local function clamp(n)
  if n ~= n or n < 0 then
    return 0
  end
  return n
end

local function refund_fixed(key, p, r)
  local window_end = r.at + r.reset
  if now + 2000 >= window_end then
    return
  end
  local value = redis.call('GET', key)
  if not value then
    return
  end
  local n = tonumber(value)
  local pttl = redis.call('PTTL', key)
  if n == nil or pttl < 0 then
    return
  end
  -- When the key's window ends, as fixed.lua reckons it (never early).
  local key_end = now + pttl * 1000 + 1000 - math.fmod(now, 1000)
  if key_end > window_end + 2000 then
    return
  end
  if n <= p.cost then
    redis.call('DEL', key)
  else
    redis.call('DECRBY', key, int(p.cost))
  end
end

local function refund_sliding(key, p, r)
  if r.first < 1 then
    return
  end
  redis.call('ZREMRANGEBYSCORE', key, int(r.first), int(r.first + p.cost - 1))
end

local function refund_bucket(key, p, r)
  local g = gcd(p.limit, p.period)
  local rate = p.limit / g
  local unit = p.period / g
  local give = p.cost * unit - (now - r.at) * rate
  if give <= 0 then
    return
  end
  local value = redis.call('GET', key)
  if not value then
    return
  end
  local stored, at = string.match(value, '^(%d+):(%d+)$')
  if not stored then
    return
  end
  -- A stamp from the future counts as now (as the algorithms read it).
  local since = math.max(now - tonumber(at), 0)
  local level = math.max(tonumber(stored) - since * rate, 0) - give
  if level <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, int(level) .. ':' .. int(now), 'PX', ttl_ms(ceil_div(level, rate)))
  end
end

local REFUND = { refund_fixed, refund_sliding, refund_bucket, refund_bucket }

-- Every refund first, then every reading: a key named twice in the group is
-- read once both of its limits gave back.
if call_id ~= nil then
  for i = 1, nkeys do
    local receipt = KEYS[nkeys + i]
    local value = redis.call('GET', receipt)
    if value then
      redis.call('DEL', receipt)
      local at, reset, first = string.match(value, '^(%d+):(%d+):(%d+)$')
      local l = limits[i]
      if at and tonumber(at) <= now and REFUND[l.code] then
        REFUND[l.code](KEYS[i], l.p, { at = tonumber(at), reset = tonumber(reset), first = tonumber(first) })
      end
    end
  end
end

local reply = {}
for i = 1, nkeys do
  local l = limits[i]
  local d = l.algo.evaluate(KEYS[i], l.p)
  local capacity = l.p.limit
  if l.algo.bucket then
    capacity = l.p.burst
  end
  reply[i] = { d.admitted and 1 or 0, math.min(clamp(d.now_remaining), capacity), clamp(d.now_reset), clamp(d.retry) }
end
return reply
