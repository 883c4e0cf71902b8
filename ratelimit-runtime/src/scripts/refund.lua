-- ratelimit: peek and refund, for Redis Cluster calls whose limits fall in
-- several slots (store/cluster.rs). Appended to the prelude and the algorithms
-- instead of the driver.
--
--   peek    KEYS: the call's n keys, then their n block markers (the
--           prelude's declared_keys). ARGV: 'peek', then the driver's
--           argument per key ("code:limit:period:burst:cost", the prelude's
--           parse_limit).
--           Reads only: the state of each limit now, for limits of the call
--           that were never checked because another slot rejected first.
--   refund  KEYS: the n keys, their n block markers, then their n receipts (receipt i is
--           `<KEYS[i]>:r:<id>:<i>`, as the driver wrote it when it admitted
--           this group under the call id). ARGV: 'refund', the call id, then the
--           argument of each key, in the order of the take. Gives back what the
--           take of this call still holds, then reads the state as peek does.
--
--   settle  KEYS as refund. ARGV: 'settle', the call id, the argument of each key of
--           the take (cost: the call's estimate), then one whole number per key, the
--           units the call used. Settles each limit to what the call used (the
--           rule's home is algorithm::settle in Rust, `settle_one` below): less
--           than the estimate gives the difference back by the receipt (the
--           algorithm's refund of that many units; nothing without a receipt), more
--           charges the excess, up to one full capacity, whatever the state holds
--           (the algorithm's evaluate and commit with the capacity waived: a debt
--           the next calls wait out, at most one period's worth).
--           The receipt is then replaced by the marker "settled" for RECEIPT_TTL_US, so a
--           settle sent twice (a cluster client's retry) settles once; a settle
--           whose receipt expired still charges its excess (never admitting more
--           than was used, failing closed).
--   return  KEYS as refund. ARGV: 'return', the call id, the argument of each key
--           of the take, then each key's receipt as the take's reply gave it
--           ("<at µs>:<reset_after µs>:<first µs>:<cost>", the value refund reads
--           from a receipt key; RedisStore::take_briefly, whose take put its
--           receipts in the reply: the prelude's receipts_in_reply). Gives back
--           what refund would give back had the take written those receipts:
--           nothing once such a receipt would have expired, and once only, the
--           receipt's name then holding the marker "settled" as settle leaves
--           it (a return or refund under the id after it gives back nothing).
--
-- The reply is the driver's rejected-call reply: per key {admitted (0/1),
-- remaining, reset_after µs, retry_after µs}.
--
-- A refund is judged by the server's own time, never by a delay measured on a
-- client, and gives back at most what the call still holds. It reads and
-- DELETES the call's receipt "<at µs>:<reset_after µs>:<first µs>" (the
-- server's time at the take, the limit's reset_after after it, the first
-- sliding entry). A refund sent twice (the cluster client retries a script
-- after a timeout, although the first attempt ran) finds no receipt the second
-- time and gives back nothing; so does a refund that arrives after the receipt
-- expired (its TTL is the longest the call can hold anything of the limit), or
-- on a server whose clock reads earlier than the take's (a failover to a
-- replica whose clock is behind: how long the call has held its units is then
-- unknown). What a receipt gives back is each algorithm's own rule: the
-- `refund` of fixed.lua, sliding.lua and bucket.lua.
--
-- One function, `compensate(KEYS, ARGV)`, as the driver's `check` is: an `EVAL`
-- script ends by calling it, a Functions library registers it. (Its body is
-- left unindented, as it was when it was the whole script.)
-- Gives back `units` of what the take of limit `l` under `key` still holds, by
-- its receipt `r`, never more than the receipt says the call took (the rule's
-- home is algorithm::refund in Rust).
local function give_back(key, l, r, units)
  units = math_min(units, r.cost)
  if r.at > now or units < 1 then
    return
  end
  local p = l.p
  if units ~= p.cost then
    p = { limit = p.limit, period = p.period, burst = p.burst, cost = units }
  end
  l.algo.refund(key, p, r)
end

-- Settles limit `l` of a call under `key` to `actual` units (see `settle` above),
-- `r` its receipt (nil when gone): from the estimate the receipt says the call
-- took, or the call's cost in ARGV once the receipt is gone.
local function settle_one(key, l, r, actual)
  local p = l.p
  if l.algo == ALGOS[7] then
    return -- a concurrency slot is held, not spent: nothing to settle
  end
  local estimate = p.cost
  if r then
    estimate = r.cost
  end
  if actual < estimate then
    if r then
      give_back(key, l, r, estimate - actual)
    end
  elseif actual > estimate then
    -- Normalized as a check normalizes (a read with the limit's own parameters), then the
    -- excess taken with the capacity waived.
    l.algo.evaluate(key, p)
    -- The excess, up to one full capacity (a debt of at most one period).
    local excess = math_min(actual - estimate, l.capacity)
    local waived = { limit = p.limit, period = p.period, burst = p.burst, cost = excess }
    waived[l.algo.capacity] = WAIVED_CAPACITY
    l.algo.commit(key, waived, l.algo.evaluate(key, waived))
  end
end

local function compensate(KEYS, ARGV)
if redis_call == nil then
  bind_builtins()
end
read_clock()
waits_from_ms_start = false
local mode = ARGV[1]
local call_id = nil
local offset = 1
local per_key = 1
if mode == 'refund' or mode == 'settle' or mode == 'return' then
  call_id = ARGV[2]
  offset = 2
end
if mode == 'settle' or mode == 'return' then
  per_key = 2
end
local nkeys = (#ARGV - offset) / per_key
if (mode ~= 'peek' and mode ~= 'refund' and mode ~= 'settle' and mode ~= 'return') or nkeys < 1 or nkeys ~= math_floor(nkeys) then
  return redis.error_reply('ERR ratelimit: expected peek with n keys and 1 + n arguments, or refund with n keys, n receipts and 2 + n arguments, or settle or return with n keys, n receipts and 2 + 2n arguments; got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
if call_id ~= nil and not valid_call_id(call_id) then
  return redis.error_reply(BAD_CALL_ID)
end
holder = call_id
-- The markers, and in a refund the receipts of key i under this call id.
local markers, refused_keys, receipts = declared_keys(KEYS, nkeys, false, call_id)
if not markers then
  return refused_keys
end

local limits, refused = parse_limits(ARGV, offset, nkeys)
if not limits then
  return refused
end

-- A settle: each limit in order, then every reading.
if mode == 'settle' then
  local actuals = {}
  for i = 1, nkeys do
    -- Digits only, as a limit's numbers are (the prelude's parse_limit).
    local text = ARGV[offset + nkeys + i]
    local actual = string_match(text, '^%d+$') and tonumber(text)
    if not actual or actual > WAIVED_CAPACITY then
      return redis.error_reply('ERR ratelimit: invalid actual units for key ' .. i)
    end
    actuals[i] = actual
  end
  for i = 1, nkeys do
    local receipt = KEYS[receipts + i]
    local value = redis_call('GET', receipt)
    if value ~= 'settled' then
      local r = value and read_receipt(value)
      settle_one(KEYS[i], limits[i], r, actuals[i])
      redis_call('SET', receipt, 'settled', 'PX', ttl_ms(RECEIPT_TTL_US))
    end
  end
-- The receipts the take's reply carried: each gives back as a receipt key
-- would, while that key would still exist (its TTL the receipt's reset_after,
-- at most RECEIPT_TTL_US, from the take's millisecond), and once.
elseif mode == 'return' then
  for i = 1, nkeys do
    local r = read_receipt(ARGV[offset + nkeys + i])
    if r and floor_div(now, 1000) <= floor_div(r.at, 1000) + math_max(ceil_div(math_min(r.reset, RECEIPT_TTL_US), 1000), 1)
      and redis_call('SET', KEYS[receipts + i], 'settled', 'NX', 'PX', RECEIPT_TTL_MS_TEXT) then
      give_back(KEYS[i], limits[i], r, limits[i].p.cost)
    end
  end
-- Every refund first, then every reading: a key named twice in the group is
-- read once both of its limits gave back.
elseif call_id ~= nil then
  for i = 1, nkeys do
    local receipt = KEYS[receipts + i]
    local value = redis_call('GET', receipt)
    -- A settled call's marker stays: a refund never lets a retried settle charge twice.
    if value and value ~= 'settled' then
      redis_call('DEL', receipt)
      local r = read_receipt(value)
      if r then
        give_back(KEYS[i], limits[i], r, limits[i].p.cost)
      end
    end
  end
end

-- A blocked limit (the prelude's block_reply) reads as rejected until the block's
-- end, as the driver answers it.
local reply = {}
for i = 1, nkeys do
  local l = limits[i]
  reply[i] = block_reply(KEYS[markers + i], l, l.algo.evaluate(KEYS[i], l.p))
end
return reply
end
