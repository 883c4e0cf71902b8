-- ratelimit: the driver. Checks every limit of ONE call, writes only when all
-- admit (a rejected call leaves every key as it was), and returns, per limit,
-- {admitted (0/1), remaining, reset_after µs, retry_after µs}: a call of one
-- limit is answered with its row itself, not in an array of one (building and
-- sending that array costs ~5% of a one-limit check's server time); a call of
-- several, with an array of them. A call that was taken is answered with its
-- rows' numbers packed in one string instead (the prelude's taken_row and
-- packed_rows).
--
-- ARGV holds one argument per key (see the prelude), then optionally a call id
-- ([0-9a-f], at most 32; a take under an id that already left receipts is not
-- taken again): with one, an admitted call also leaves a receipt per
-- limit (the prelude's write_receipt), whose TTL is reset_after (the longest
-- the call can hold anything of that limit), at most RECEIPT_TTL_US, or at most
-- the TTL the call gives after its id (the prelude's call_shape): a refund
-- comes within one cross-slot check, or right after an answer given up on,
-- and a refund that finds no receipt gives back nothing (never too much). The Redis Cluster store takes limits that
-- fall in several slots one slot at a time, and gives back through these
-- receipts what an earlier slot took when a later one rejects (refund.lua).
--
-- The driver only composes: the rules are the algorithms' (fixed.lua,
-- sliding.lua, bucket.lua), the parsing, receipts and replies the prelude's,
-- but for the usual call of one limit, which an algorithm's check_one decides
-- and answers itself (see `check`).
--
-- It is one function, `check(KEYS, ARGV[, from_ms_start])`, defined once the
-- prelude and the algorithms are: an `EVAL` script ends by calling it on the
-- script's KEYS and ARGV, a Functions library registers it (see
-- store/redis.rs). Its body is the same either way; only what is built per
-- call differs (all of the chunk under `EVAL`, the call's own tables under
-- `FCALL`).

-- The reply of a call of `nkeys` limits whose rows are `reply`: a one-limit
-- call's own row (see the top of this file).
local function answer(reply, nkeys)
  if nkeys == 1 then
    return reply[1]
  end
  return reply
end

-- The receipts of an admitted call, one per limit: KEYS[receipts + i] for limit i.
local function write_receipts(KEYS, receipts, limits, nkeys, decisions)
  for i = 1, nkeys do
    write_receipt(KEYS[receipts + i], limits[i], decisions[i])
  end
end

-- The call of limit `l` alone on KEYS[1], not blocked: taken when it admits
-- (with a call id, its receipt written to KEYS[receipts + 1]), answered
-- either way.
local function take_one(KEYS, l, receipts)
  local key = KEYS[1]
  local d = l.algo.evaluate(key, l.p)
  if not d.admitted then
    return state_reply(l, d, false, d.retry)
  end
  l.algo.commit(key, l.p, d)
  if receipts ~= nil then
    write_receipt(KEYS[receipts + 1], l, d)
  end
  return taken_row(taken_figures(l, d))
end

-- `from_ms_start`: the waits answered from the start of the server's
-- millisecond (fixed_only.lua's hand-offs; nil from FCALL and EVAL).
local function check(KEYS, ARGV, from_ms_start)
  if redis_call == nil then
    bind_builtins()
  end
  read_clock()
  waits_from_ms_start = from_ms_start == true
  -- The usual call, one limit without a call id (its block marker declared as
  -- KEYS[2]), its receipt in the reply or none (RateLimiter's default take,
  -- RedisStore::check): once no block marker is found, decided by its
  -- algorithm's check_one, or else by take_one, without the general path's
  -- shape, keys and limits read again. Everything else (a block marker, even
  -- one without a TTL, which is no block; a call id, a first argument that is
  -- not a limit, other KEYS, a hand-off from fixed_only.lua, whose waits count
  -- from the start of the millisecond) takes the path below, which checks and
  -- answers it as any call.
  local nargs = #ARGV
  if #KEYS == 2 and not waits_from_ms_start
    and (nargs == 1 or (nargs == 2 and ARGV[2] == '~')) then
    local spec = ARGV[1]
    local l = PARSED[spec] or parse_limit(spec, 1)
    if l and KEYS[2] == KEYS[1] .. ':b' and redis_call('EXISTS', KEYS[2]) == 0 then
      -- As call_shape and the path below set them for a call without an id.
      holder = nil
      receipts_in_reply = nargs == 2
      local algo = l.algo
      if algo.check_one then
        return algo.check_one(KEYS[1], l)
      end
      return take_one(KEYS, l, nil)
    end
  end
  -- KEYS as the prelude's declared_keys says: the n keys, their block markers,
  -- their working copies when a key repeats, their receipts with a call id.
  local nkeys, call_id = call_shape(ARGV)
  if nkeys == 0 then
    return redis.error_reply('ERR ratelimit: expected one argument per key, then optionally a call id and its receipts\' TTL (1 to 10000 ms); got '
      .. #ARGV .. ' arguments for ' .. #KEYS .. ' keys')
  end
  if call_id ~= nil and not valid_call_id(call_id) then
    return redis.error_reply(BAD_CALL_ID)
  end
  holder = call_id
  local markers, copies, receipts = declared_keys(KEYS, nkeys, true, call_id)
  if not markers then
    return copies
  end

  local limits, refused = parse_limits(ARGV, 0, nkeys)
  if not limits then
    return refused
  end

  -- A take under a call id that already left its receipts ran before: the
  -- cluster client sent it again after a timeout. It is not taken twice; the
  -- reply reads the limits as that first take left them. It writes one thing:
  -- the receipt's own TTL again (at least 1 ms; a receipt without one, written
  -- by someone else, the longest a receipt lives), so that a `WAIT` sent after
  -- it on a connection of its own (a client's retry after a dropped
  -- connection) waits for the first take's writes too, which came before on
  -- this server.
  local kept = call_id ~= nil and redis_call('PTTL', KEYS[receipts + 1]) or -2
  if kept ~= -2 then
    if kept == -1 then
      kept = RECEIPT_TTL_US / 1000
    end
    redis_call('PEXPIRE', KEYS[receipts + 1], math_max(kept, 1))
    local again = {}
    for i = 1, nkeys do
      local d = limits[i].algo.evaluate(KEYS[i], limits[i].p)
      again[i] = state_reply(limits[i], d, true, 0)
    end
    return answer(again, nkeys)
  end

  -- Blocks (RateLimiter::block): a key `<KEYS[i]>:b` (KEYS[markers + i]) with a TTL rejects every
  -- call on limit i until it expires, whatever the limit's state. Read after the
  -- replay above: a take that ran before is answered as it ran, so the cluster
  -- store refunds it like any other when a later slot rejects. The hot path
  -- pays one EXISTS for all of the call's keys; only a call that finds a block
  -- reads more. A blocked call takes nothing: the other limits report their
  -- state as it is. A marker without a TTL (written by someone else) is no block.
  local blocked
  if nkeys == 1 then
    blocked = redis_call('EXISTS', KEYS[markers + 1]) > 0
  else
    blocked = redis_call('EXISTS', unpack(KEYS, markers + 1, markers + nkeys)) > 0
  end
  if blocked then
    local reply = {}
    blocked = false
    for i = 1, nkeys do
      local l = limits[i]
      local this
      reply[i], this = block_reply(KEYS[markers + i], l, l.algo.evaluate(KEYS[i], l.p))
      blocked = blocked or this
    end
    if blocked then
      return answer(reply, nkeys)
    end
  end

  -- One limit that the shortcut above did not take (a call id, a block
  -- marker found, a hand-off from fixed_only.lua): the loop below for a
  -- single key, without its tables (no key can repeat).
  if nkeys == 1 then
    return take_one(KEYS, limits[1], receipts)
  end

  -- Keys are few: comparing each with those before it is cheaper than a set.
  local repeated = false
  for i = 2, nkeys do
    local key = KEYS[i]
    for j = 1, i - 1 do
      if KEYS[j] == key then
        repeated = true
      end
    end
  end

  -- Made for two limits (the usual stack), not grown one entry at a time: a
  -- table grown so is resized at every power of two (BENCHMARKS.md, "Stacked
  -- limits, tables made to size").
  local decisions = { false, false }

  if not repeated then
    -- The usual case: distinct keys. Evaluate all, then write all or nothing.
    local all = true
    for i = 1, nkeys do
      decisions[i] = limits[i].algo.evaluate(KEYS[i], limits[i].p)
      if not decisions[i].admitted then
        all = false
      end
    end
    if not all then
      local reply = { false, false }
      for i = 1, nkeys do
        local d = decisions[i]
        reply[i] = state_reply(limits[i], d, d.admitted, d.retry)
      end
      return reply
    end
    if nkeys == 2 and not receipts_in_reply then
      -- The usual stack: its two rows packed at once, as packed_rows packs
      -- them (the leading 1, then each limit's remaining and reset_after),
      -- where add_taken and packed_rows cost a call of two limits about 3,000
      -- instructions more (BENCHMARKS.md, "Two stacked limits packed at
      -- once"). The format is a literal, not a local of the chunk: under
      -- EVAL (Redis 6.2) the chunk runs per call, and each local its
      -- functions capture lengthens the walk over its open upvalues that
      -- every capture after it makes (measured: about 2,000 instructions
      -- more per check of one fixed window).
      local l1, l2, d1, d2 = limits[1], limits[2], decisions[1], decisions[2]
      l1.algo.commit(KEYS[1], l1.p, d1)
      l2.algo.commit(KEYS[2], l2.p, d2)
      if call_id ~= nil then
        write_receipts(KEYS, receipts, limits, nkeys, decisions)
      end
      local remaining1, reset1 = taken_figures(l1, d1)
      local remaining2, reset2 = taken_figures(l2, d2)
      return struct_pack('<Bdddd', 1, remaining1, reset1, remaining2, reset2)
    end
    local count = 1
    for i = 1, nkeys do
      local d = decisions[i]
      limits[i].algo.commit(KEYS[i], limits[i].p, d)
      count = add_taken(count, taken_figures(limits[i], d))
    end
    if call_id ~= nil then
      write_receipts(KEYS, receipts, limits, nkeys, decisions)
    end
    return packed_rows(count)
  end

  -- One key named more than once: its limits apply one after the other, each
  -- seeing what the ones before it took (as the memory store does). They run on
  -- working copies of the call's keys (`<key>:w`, the same hash tag, declared as
  -- KEYS[copies + i]; the copy of a key is that of its first limit): COPY keeps
  -- a key's value and its expiry to the millisecond, so a copy reads exactly as
  -- the key does, and the keys themselves are not touched until the end. When
  -- every limit admits, each copy replaces its key (RENAME keeps the expiry the
  -- commits set); when any rejects, the copies are dropped and the keys are
  -- exactly as they were, expiry included. The reply then reads the keys.
  if not copies then
    return redis.error_reply('ERR ratelimit: a key repeats in the call, but its working copies are not declared')
  end
  local work = {}
  local copied = {}
  for i = 1, nkeys do
    local key = KEYS[i]
    if work[key] == nil then
      local copy = KEYS[copies + i]
      redis_call('DEL', copy)
      redis_call('COPY', key, copy)
      work[key] = copy
      copied[#copied + 1] = key
    end
  end
  local all = true
  local outcome = {}
  for i = 1, nkeys do
    local copy = work[KEYS[i]]
    local d = limits[i].algo.evaluate(copy, limits[i].p)
    decisions[i] = d
    outcome[i] = { admitted = d.admitted, retry = d.retry }
    if d.admitted then
      limits[i].algo.commit(copy, limits[i].p, d)
    else
      all = false
    end
  end
  if all then
    for _, key in ipairs(copied) do
      if redis_call('EXISTS', work[key]) == 1 then
        redis_call('RENAME', work[key], key)
      end
    end
    local count = 1
    for i = 1, nkeys do
      count = add_taken(count, taken_figures(limits[i], decisions[i]))
    end
    if call_id ~= nil then
      write_receipts(KEYS, receipts, limits, nkeys, decisions)
    end
    return packed_rows(count)
  end
  for _, key in ipairs(copied) do
    redis_call('DEL', work[key])
  end
  local reply = { false, false }
  for i = 1, nkeys do
    local d = limits[i].algo.evaluate(KEYS[i], limits[i].p)
    reply[i] = state_reply(limits[i], d, outcome[i].admitted, outcome[i].retry)
  end
  return reply
end
