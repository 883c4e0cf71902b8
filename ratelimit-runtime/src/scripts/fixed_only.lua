-- ratelimit: the check of a call of ONE fixed-window limit, the usual call,
-- reading only what the rule needs. The rule's home is fixed.lua (and
-- algorithm/fixed.rs); this is its second home for that one case, held to it
-- decision by decision by the conformance test.
--
-- KEYS and ARGV are the driver's for one limit (the key, its block marker, with
-- a call id its receipt; one argument "code:limit:period:burst:cost", optionally
-- the call id and its receipts' TTL, or `~` for the receipts in the reply), so
-- that whatever this path does not decide itself goes to the driver's `check`
-- on the same KEYS and ARGV, in the same script (atomic): a block marker
-- present, a take replayed under a call id that left its receipt, a cost above
-- the limit, a period that is not whole milliseconds, a value that is not a
-- counter with a TTL of at most a period, and any argument or key the driver
-- would refuse.
--
-- INCRBY takes the cost and answers the count; the key's expiry tells a live
-- window from a new key, which is then given the window's end (a period from
-- now's millisecond, as fixed.lua's SET) in the same script: no key is left
-- without a TTL. A count over the limit is undone (DECRBY, which keeps the TTL)
-- before the script returns, so a rejected call leaves the key's value and
-- expiry as they were, as the driver does.
--
-- Time: without a call id or receipts in the reply this path reads no clock
-- (TIME costs more than the rest of its Lua): the key's PTTL, from the server's
-- own millisecond, is all the rule needs, and PEXPIRE gives a new window its
-- end. So every wait it
-- answers (reset_after, retry_after) is counted from the start of the server's
-- current millisecond: the rule's figure plus the part of that millisecond
-- already gone (algorithm::fixed::whole_ms), whole milliseconds, never early,
-- less than 1 ms late. With a call id the server's time is read, for the
-- receipt (which records the exact figures the driver's does), and the waits
-- answered are the same whole milliseconds; so are those of the calls handed
-- to the driver (`check(KEYS, ARGV, true)`: the prelude's waits_from_ms_start).
--
-- The receipts in the reply (RedisStore::take_briefly) need no clock in a
-- window that is open: a fixed window's refund reads only the window's end
-- (algorithm::fixed::refund), which is the key's stored expiry (PEXPIRETIME)
-- and 1 ms, so the receipt is the start of the millisecond the key's PTTL was
-- counted from (that expiry less the PTTL) and the whole milliseconds from
-- there to the window's end (algorithm::fixed::receipt_in_reply). A window the
-- take opens is given its end from the server's time (PEXPIREAT), as with a
-- call id, so that a server paused mid-script opens it where the rule does; a
-- server without PEXPIRETIME (Redis 6.2) reads its time for every such take.

-- Milliseconds from now's to `key`'s expiry millisecond as stored (the
-- prelude's expiry_ms, after read_clock), nil when it has none: for a receipt,
-- which needs the window's exact end. Without a receipt the paths below read
-- the key's PTTL, which needs no clock.
local function stored_pttl(key)
  local at = expiry_ms(key)
  return at and at - floor_div(now, 1000)
end

-- The time of the receipt in the reply of a take of one fixed window whose key
-- has `pttl` ms left (the receipt's reset_after is the wait to the window's end
-- from the start of that millisecond: algorithm::fixed::receipt_in_reply).
-- Without the server's time (`timed` false): the start of the millisecond that
-- PTTL counted from, the key's stored expiry less its PTTL. With it: the start
-- of now's millisecond, which the expiry was read against (the prelude's
-- expiry_ms). A server that refuses PEXPIRETIME (a renamed command) is asked
-- its time after the PTTL: a receipt then ends as much late as a millisecond
-- passed between the two, never early.
local function receipt_at(key, pttl, timed)
  if not timed then
    local at = redis_pcall('PEXPIRETIME', key)
    if type(at) == 'number' then
      return (at - pttl) * 1000
    end
    read_clock()
  end
  return now - math_fmod(now, 1000)
end

-- fixed_many's working tables, per limit: its parsed limit, the count after the
-- take, the ms left of its window (nil for a window the call opens) and whether
-- the call created the key. Made by the first stacked call and reused by every
-- call after it, as the prelude's TAKEN is (see there why). Each call writes
-- entry i before it reads it (a limit's entries in the take loop, before any
-- break), so nothing of an earlier call is read; the tables never leave the
-- function.
local MANY = nil

-- A call of two or more fixed-window limits on distinct keys: as a call of one
-- (fixed_only, below), limit by limit (INCRBY, then the key's expiry), all in
-- the one script. When every limit admits the call, each new window is given
-- its end and the call answered; when one does not, or anything fixed_only
-- hands to the driver turns up, what was taken is undone (DECRBY; a key the
-- call created is deleted) and the driver answers, on the keys as they were.
-- KEYS and ARGV are the driver's (keys, markers, receipts with a call id; one
-- argument a limit, then the id and its receipts' TTL or `~`, as call_shape
-- reads them).
local function fixed_many(KEYS, ARGV, n, call_id)
  if n < 1 then
    return check(KEYS, ARGV, true)
  end
  if call_id ~= nil then
    if #KEYS ~= 3 * n or not valid_call_id(call_id) then
      return check(KEYS, ARGV, true)
    end
  elseif #KEYS ~= 2 * n then
    return check(KEYS, ARGV, true)
  end
  local many = MANY
  if many == nil then
    many = {
      limits = { false, false },
      counts = { false, false },
      left = { false, false },
      fresh = { false, false },
    }
    MANY = many
  end
  local limits = many.limits
  for i = 1, n do
    local key = KEYS[i]
    if KEYS[n + i] ~= key .. ':b'
      or (call_id ~= nil and KEYS[2 * n + i] ~= receipt_key(key, call_id, i)) then
      return check(KEYS, ARGV, true)
    end
    for j = 1, i - 1 do
      if KEYS[j] == key then
        return check(KEYS, ARGV, true)
      end
    end
    local l = parse_limit(ARGV[i], i)
    if l == nil or l.fixed_ms == nil then
      return check(KEYS, ARGV, true)
    end
    limits[i] = l
  end
  -- The blocks and, under a call id, a take that ran before (its first receipt):
  -- one EXISTS, as fixed_only asks.
  local asked = 2 * n
  if call_id ~= nil then
    asked = asked + 1
  end
  if redis_call('EXISTS', unpack(KEYS, n + 1, asked)) > 0 then
    return check(KEYS, ARGV, true)
  end
  local timed = call_id ~= nil or receipts_in_reply
  if timed then
    read_clock()
  end
  local counts, left, fresh = many.counts, many.left, many.fresh
  local admitted = true
  local undo = 0
  -- Without receipts, a call that opens no window is answered from what the
  -- take loop read, without going over its limits again: two limits (the
  -- usual stack) packed at once, as the driver packs them, more through
  -- add_taken and packed_rows.
  local rows = 1
  local opened = false
  for i = 1, n do
    local key = KEYS[i]
    local l = limits[i]
    local p = l.p
    local got = redis_pcall('INCRBY', key, p.cost_text)
    if type(got) ~= 'number' then
      admitted = false
      break
    end
    undo = i
    counts[i] = got
    local count = got - p.cost
    local pttl
    if timed then
      pttl = stored_pttl(key)
    else
      pttl = redis_call('PTTL', key)
      if pttl < 0 then
        pttl = nil
      end
    end
    left[i] = pttl
    if pttl == nil then
      fresh[i] = count == 0
      if count ~= 0 then
        admitted = false
        break
      end
      opened = true
      pttl = l.fixed_ms
    else
      fresh[i] = false
      if count < 0 or pttl > l.fixed_ms or got > p.limit then
        admitted = false
        break
      end
    end
  end
  if not admitted then
    for i = 1, undo do
      if fresh[i] then
        -- Created by this call (or a 0 without a TTL, which is no window).
        redis_call('DEL', KEYS[i])
      else
        redis_call('DECRBY', KEYS[i], limits[i].p.cost_text)
      end
    end
    return check(KEYS, ARGV, true)
  end
  if not (timed or opened) then
    if n == 2 then
      return struct_pack('<Bdddd', 1, limits[1].p.limit - counts[1],
        left[1] * 1000 + 1000, limits[2].p.limit - counts[2], left[2] * 1000 + 1000)
    end
    for i = 1, n do
      rows = add_taken(rows, limits[i].p.limit - counts[i], left[i] * 1000 + 1000)
    end
    return packed_rows(rows)
  end
  for i = 1, n do
    local l = limits[i]
    local pttl = left[i]
    if pttl == nil then
      pttl = l.fixed_ms
      if timed then
        redis_call('PEXPIREAT', KEYS[i], int(floor_div(now, 1000) + pttl))
      else
        redis_call('PEXPIRE', KEYS[i], l.period_ms_text)
      end
    end
    local wait = pttl * 1000 + 1000
    if call_id ~= nil then
      write_receipt(KEYS[2 * n + i], l, { after_reset = wait - math_fmod(now, 1000) })
    end
    if receipts_in_reply then
      -- As receipt_at, from the server's time this path read (never with a
      -- call id: call_shape reads one or the other).
      rows = add_taken(rows, l.p.limit - counts[i], wait,
        now - math_fmod(now, 1000), wait, 0)
    else
      rows = add_taken(rows, l.p.limit - counts[i], wait)
    end
  end
  return packed_rows(rows)
end

-- The entry point for calls of fixed-window limits only, on distinct keys: a
-- call of one limit is decided here, a stacked call by fixed_many. A call of
-- one argument is one limit without a call id (or malformed, which this hands
-- to the driver): no receipts, so no call_shape.
local function fixed_only(KEYS, ARGV)
  if redis_call == nil then
    bind_builtins()
  end
  local call_id = nil
  if #ARGV <= 1 then
    -- No receipts; their TTL reset all the same, as call_shape does, so that no
    -- call ever sees another's.
    receipt_ttl_us = RECEIPT_TTL_US
    receipt_ttl_text = RECEIPT_TTL_MS_TEXT
    receipts_in_reply = false
  else
    local n
    n, call_id = call_shape(ARGV)
    if n ~= 1 then
      return fixed_many(KEYS, ARGV, n, call_id)
    end
  end
  local key = KEYS[1]
  if call_id ~= nil then
    if #KEYS ~= 3 or not valid_call_id(call_id) or KEYS[3] ~= receipt_key(key, call_id, 1) then
      return check(KEYS, ARGV, true)
    end
  elseif #KEYS ~= 2 or #ARGV ~= (receipts_in_reply and 2 or 1) then
    return check(KEYS, ARGV, true)
  end
  -- The server's time, for a receipt in a key, and for one in the reply on a
  -- server without PEXPIRETIME (before Redis 7.0, which tells its version),
  -- which reads the window's end from it.
  local timed = call_id ~= nil or (receipts_in_reply and redis_version_num == nil)
  if KEYS[2] ~= key .. ':b' then
    return check(KEYS, ARGV, true)
  end
  -- Not a fixed window this path decides (another algorithm, a cost above the
  -- limit, a period that is not whole milliseconds: the prelude's fixed_ms).
  local spec = ARGV[1]
  local l = PARSED[spec] or parse_limit(spec, 1)
  local period_ms = l and l.fixed_ms
  if period_ms == nil then
    return check(KEYS, ARGV, true)
  end
  local p = l.p
  -- A block (the driver tells a marker with a TTL from one without), and a take
  -- that ran before under this call id (its receipt is there): the driver
  -- answers. One EXISTS asks both.
  local found
  if call_id == nil then
    found = redis_call('EXISTS', KEYS[2])
  else
    found = redis_call('EXISTS', KEYS[2], KEYS[3])
  end
  if found > 0 then
    return check(KEYS, ARGV, true)
  end
  if timed then
    read_clock()
  end
  -- Not a counter INCRBY can raise (another type, not an integer, an overflow,
  -- or a write refused for memory): nothing was written, the driver answers.
  local n = redis_pcall('INCRBY', key, p.cost_text)
  if type(n) ~= 'number' then
    return check(KEYS, ARGV, true)
  end
  local count = n - p.cost
  -- The window's ms left (nil: no expiry), as stored when a receipt needs it.
  local pttl
  if timed then
    pttl = stored_pttl(key)
  else
    pttl = redis_call('PTTL', key)
    if pttl < 0 then
      pttl = nil
    end
  end
  if pttl == nil then
    if count ~= 0 then
      -- A counter without a TTL (written by someone else): the driver's rule
      -- replaces it; undone first.
      redis_call('DECRBY', key, p.cost_text)
      return check(KEYS, ARGV, true)
    end
    -- A new window (the key was absent, or an immortal 0): it ends a period
    -- from now's millisecond, and is gone the one after.
    if timed or receipts_in_reply then
      if not timed then
        -- Redis 7.0 or later (else `timed`): a clock read after a write is allowed.
        read_clock()
        timed = true
      end
      redis_call('PEXPIREAT', key, int(floor_div(now, 1000) + period_ms))
    else
      redis_call('PEXPIRE', key, l.period_ms_text)
    end
    pttl = period_ms
  elseif count < 0 or pttl > period_ms then
    -- A negative count, or more than a period left (a clock ahead of this
    -- one): the driver's rule puts it right; undone first.
    redis_call('DECRBY', key, p.cost_text)
    return check(KEYS, ARGV, true)
  end
  -- The wait until the key is gone, from the start of now's millisecond.
  local left = pttl * 1000 + 1000
  if n > p.limit then
    redis_call('DECRBY', key, p.cost_text)
    return { 0, clamp(p.limit - count), left, left }
  end
  if call_id ~= nil then
    write_receipt(KEYS[3], l, { after_reset = left - math_fmod(now, 1000) })
  elseif receipts_in_reply then
    return taken_row(p.limit - n, left, receipt_at(key, pttl, timed), left, 0)
  end
  -- taken_row's row, packed here: its call costs more than the pack.
  return struct_pack(TAKEN_ROW, 1, p.limit - n, left)
end
