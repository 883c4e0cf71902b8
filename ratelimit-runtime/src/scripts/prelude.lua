-- ratelimit: the prelude shared by every script: the server's time, number
-- helpers, the algorithm registry, the parsing of the arguments, receipts and
-- replies.
--
-- One call checks every limit of ONE request: KEYS[i] is the key of limit i and
-- ARGV[i] its parameters, five whole numbers joined by ':' (algorithm code,
-- limit, period µs, burst, cost: "1:5:60000000:5:1"). Time is the server's own
-- (`TIME`), in microseconds, so app servers with skewed clocks share one
-- consistent limit.
--
-- Numbers: Lua numbers are doubles, exact for integers up to 2^53 (µs since the
-- epoch fit with centuries to spare). Every number handed to Redis goes through
-- `int()` because Lua turns numbers into strings with 14 significant digits,
-- which would round a µs timestamp. Every number returned is a whole number
-- (clamp), in a table of integers or packed as doubles (taken_row).

-- The builtins the scripts call, as locals of the chunk: a Functions library's
-- code reads a global through its environment's metatable, about 200
-- instructions a read on Redis 7.0, where a local costs a few (BENCHMARKS.md,
-- "The builtins bound once per library"). A library may read no global while it
-- loads, so each entry point (the driver's `check`, refund.lua's `compensate`,
-- fixed_only.lua's `fixed_only`) binds them on its first call
-- (`if redis_call == nil then bind_builtins() end`), before anything else, and
-- the library keeps them from then on. `builtins` is defined before the locals
-- that shadow `type`, `tonumber` and `unpack`, so it reads the globals. The
-- `EVAL` scripts (servers without Functions) are sent without this block, with
-- each bound name its global again (store/redis/script.rs, `eval_form`).
local function builtins()
  return redis.call, redis.pcall, redis.REDIS_VERSION_NUM, type, tonumber, unpack,
    math.floor, math.fmod, math.min, math.max, string.match, string.find,
    string.byte, string.format, struct.pack
end

local redis_call, redis_pcall, redis_version_num, type, tonumber, unpack,
  math_floor, math_fmod, math_min, math_max, string_match, string_find,
  string_byte, string_format, struct_pack

local function bind_builtins()
  redis_call, redis_pcall, redis_version_num, type, tonumber, unpack,
    math_floor, math_fmod, math_min, math_max, string_match, string_find,
    string_byte, string_format, struct_pack = builtins()
end

-- A whole number as a decimal string, exact up to 2^53. '%d' formats through
-- a C long, several times cheaper than '%.0f' (no floating-point printing):
-- used where a long holds 2^53 (64-bit builds, as Redis's are), '%.0f'
-- elsewhere. The two agree on every whole number, the only numbers given here.
-- Chosen by the first call (read_clock, below): a Functions library may not use the
-- string library while it loads.
local INT_FORMAT = nil

local function int(n)
  -- Beyond 2^53 a double is no longer a whole number of units, and '%d' would wrap at 2^63:
  -- an error (nothing written) rather than a value that reads as another state.
  if n >= 9007199254740992 or n <= -9007199254740992 then
    error('ratelimit: a number beyond 2^53 cannot be stored exactly')
  end
  return string_format(INT_FORMAT, n)
end

-- The server's time in µs, read by every entry point (the driver's `check`,
-- refund.lua's `compensate`) before anything else: `read_clock()`. A local of
-- the chunk, not a global, so that the same text serves as an `EVAL` script
-- (the chunk runs per call) and as a Functions library (the chunk runs once at
-- `FUNCTION LOAD`; a library cannot set globals, and its functions read `now`
-- as an upvalue set per call).
local now = 0

-- TIME's reply that `now` was read from ({ seconds, microseconds }, digits),
-- for now_text (below).
local now_digits = nil

-- The call id of the call being checked or refunded (nil: none), set by each
-- entry point after `read_clock()`: the holder a concurrency lease is named by
-- (concurrency.lua).
local holder = nil

-- Whether this chunk switched to effects replication (read_clock, below).
local REPLICATING = false

-- Chooses INT_FORMAT (above), once per chunk: by every entry point's first
-- call, before any number is written (read_clock, parse_limit).
local function choose_int_format()
  if INT_FORMAT == nil then
    INT_FORMAT = '%.0f'
    if string_format('%d', 2 ^ 53) == '9007199254740992' then
      INT_FORMAT = '%d'
    end
  end
end

local function read_clock()
  -- Before Redis 5, a script that writes after a non-deterministic command such
  -- as TIME must switch to effects replication first; from Redis 5 on it is the
  -- default (and from 7 on the function is a no-op kept for compatibility).
  -- Asked once per chunk: per call under EVAL (the chunk runs per call), once
  -- for a Functions library (Redis 7 and later), whose chunk stays loaded.
  if not REPLICATING then
    if redis.replicate_commands ~= nil then
      redis.replicate_commands()
    end
    REPLICATING = true
  end
  local time = redis_call('TIME')
  -- Two strings of digits: arithmetic converts each once (Lua 5.1's tonumber
  -- converts its argument twice).
  now = time[1] * 1000000 + time[2]
  now_digits = time
  choose_int_format()
end

-- `now` as decimal digits, as int(now) writes it, from TIME's own two strings
-- (seconds, then microseconds without leading zeros): one concatenation
-- instead of a formatted number, which costs a receipt more than its SET.
local MICROS_PAD = { '00000', '0000', '000', '00', '0', '' }

local function now_text()
  local secs, micros = now_digits[1], now_digits[2]
  if type(micros) ~= 'string' or type(secs) ~= 'string' then
    return int(now)
  end
  local pad = MICROS_PAD[#micros]
  if pad == nil or secs == '0' or string_byte(secs, 1) == 45 then
    return int(now)
  end
  return secs .. pad .. micros
end

-- a / b rounded up, for non-negative integers a and b > 0 below 2^53. The
-- double division may round the quotient to the wrong side of a whole number
-- when a is large; the remainder, exact in integers, puts it right.
local function ceil_div(a, b)
  local q = math_floor(a / b)
  local r = a - q * b
  if r > 0 then
    return q + 1
  end
  if r <= -b then
    return q - 1
  end
  return q
end

-- a / b rounded down, for non-negative integers a and b > 0 below 2^53 (the
-- remainder puts a misrounded double quotient right, as in ceil_div).
local function floor_div(a, b)
  local q = math_floor(a / b)
  local r = a - q * b
  if r < 0 then
    return q - 1
  end
  if r >= b then
    return q + 1
  end
  return q
end

-- Greatest common divisor of two positive integers (exact below 2^53).
local function gcd(a, b)
  while b > 0 do
    a, b = b, math_fmod(a, b)
  end
  return a
end

-- A TTL in whole milliseconds for `us` microseconds from now: rounded up, at
-- least 1 ms, so a key never outlives its state by more than a millisecond and
-- never gets an immortal or zero TTL.
local function ttl_ms(us)
  local ms = ceil_div(us, 1000)
  if ms < 1 then
    ms = 1
  end
  return int(ms)
end

-- The live clock's millisecond (TIME: not the script's frozen `now`).
local function live_ms()
  local t = redis_call('TIME')
  return floor_div(t[1] * 1000000 + t[2], 1000)
end

-- The millisecond at which `key` expires, or nil when it is absent or has no
-- expiry. Read as it is stored (PEXPIRETIME, Redis 7.0), not as now_ms + PTTL:
-- Redis counts PTTL from its live clock, which runs on while a script runs, so
-- a server paused mid-script would read the expiry early. A server without
-- PEXPIRETIME (before 7.0, where only the scripts run) is read with PTTL,
-- which counts from the live clock's millisecond at that moment: one no earlier
-- than the clock read before it (the script's, else TIME) and no later than
-- TIME read right after it. When the two read the same millisecond (almost
-- always), the expiry is exact; when a millisecond passed between them (or the
-- server paused), the read is tried again, twice at most, then taken at the
-- later clock: never early (which would admit early), at worst a millisecond
-- late. The home of every read of a limit's expiry: the fixed window's end
-- (fixed.lua), GCRA's tat and a bucket's level (gcra.lua, bucket.lua), which
-- keep their state in it.
local function expiry_ms(key)
  local at = redis_pcall('PEXPIRETIME', key)
  if type(at) ~= 'number' then
    local before = floor_div(now, 1000)
    for attempt = 1, 3 do
      local pttl = redis_call('PTTL', key)
      if pttl < 0 then
        return nil
      end
      local after = live_ms()
      if after == before or attempt == 3 then
        return after + pttl
      end
      before = live_ms()
    end
  end
  if at < 0 then
    return nil
  end
  return at
end

-- Algorithms by code (Algorithm::code() on the Rust side), each registered by
-- its own file, which holds the whole of its rule (fixed.lua, sliding.lua,
-- bucket.lua for the token and the leaky bucket). Each entry has
--   capacity: which parameter is the most `remaining` can be, 'limit', or
--       'burst' for the buckets.
--   evaluate(key, p) -> decision: reads only. `p` holds limit, period (µs),
--       burst, cost. The decision holds `admitted`, `now_remaining` and
--       `now_reset` (the state as it is), `after_remaining` and `after_reset`
--       (the state once the call is taken, when admitted), `retry` (µs until
--       the same call would be admitted, when rejected), `write`, what commit
--       needs, and `first`, what a receipt records beyond the time of the take
--       and its reset (sliding: the score of the call's first entry; absent,
--       i.e. 0, for the others).
--   commit(key, p, d) : the writes, each with its TTL.
--   refund(key, p, r) : gives back p.cost of what the take of one call (its
--       receipt `r`: at, reset, first, cost; see read_receipt) still holds, judged
--       by `now` (refund.lua's give_back bounds p.cost by the receipt's cost).
--   check_one(key, l), optional: the whole of the usual call, limit `l` alone
--       on `key`, not blocked, without a call id (the driver hands it over):
--       evaluate, commit and the driver's reply (state_reply's row, or the
--       packed taken_row) in one, without the decision's table. It rejects
--       exactly when evaluate does: its test is the negation of evaluate's
--       (`not (x <= y)`), so a state that reads as NaN rejects on both.
--
-- State stamped in the future (a failover to a replica whose clock is behind
-- the old master's) is treated as stamped now: each rule's decision (read by
-- evaluate and check_one alike) rewrites its stamps to now before deciding, never counting the skew as a charge, so no caller is
-- locked out beyond the true retry_after. State kept as one integer (GCRA's
-- tat, a bucket's level) has no stamp to tell a skew from a backlog: a backlog
-- longer than the most it can be is brought back to that most, from now
-- (bounded: at most one full burst more for GCRA, one capacity of debt for a
-- bucket). That rewrite is the only write a rejected call can make, and it
-- never lets the state admit more.
local ALGOS = {}

-- Reads the limits of one call: for limit i, KEYS[i] and its argument
-- argv[offset + i] of the call's ARGV, "code:limit:period:burst:cost" (algorithm
-- code, limit, period µs, burst, cost), parsed and checked here once for the
-- driver and the refund script alike. One string a limit: Redis makes an object
-- of every argument and pushes it into ARGV, which costs a check more than
-- parsing the string (BENCHMARKS.md, "One argument per limit").
-- Returns the limits ({ algo, code, p, capacity } each), or nil and the error
-- reply.
--
-- Parsed limits are kept by their argument as it arrives (PARSED), read-only
-- from then on (no rule writes to `p` or to a limit): a Functions library keeps
-- them between calls, where parsing and checking five numbers cost more than
-- the rest of the call's Lua; an `EVAL` chunk starts with an empty cache. Only
-- arguments that parse as a valid limit are kept. At most PARSED_MAX are kept
-- (costs vary per call): then it starts over.
local PARSED = {}
local PARSED_COUNT = 0
local PARSED_MAX = 1000

-- Whether a parsed argument is a whole number from `least` up to below 2^53 (so that
-- `int()` writes it exactly). Its text is digits only (parse_limit's pattern), so
-- no sign, fraction, exponent, "nan" or "inf" reaches here; a long enough string
-- of digits still reads as a double beyond 2^53, or as inf.
local function whole(n, least)
  return n ~= nil and n >= least and n < 9007199254740992 and n == math_floor(n)
end

-- Limit i of a call, whose argument is `spec`: the parsed limit (from PARSED), or
-- nil and the error reply.
local function parse_limit(spec, i)
  local limit = PARSED[spec]
  if limit == nil then
    choose_int_format()
    -- Admitted rows are packed (taken_row): a server whose scripts' struct
    -- library has no `pack` refuses every call here, before anything is
    -- written, rather than after a take (one without the library at all fails
    -- as early, on reading `struct`).
    if struct_pack == nil then
      return nil, redis.error_reply('ERR ratelimit: the scripts of this server have no struct.pack')
    end
    local code, lim, period, burst, cost =
      string_match(spec, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
    if code == nil then
      return nil, redis.error_reply('ERR ratelimit: invalid parameters for key ' .. i
        .. ': expected five whole numbers joined by ":"')
    end
    code = tonumber(code)
    local algo = ALGOS[code]
    if algo == nil then
      return nil, redis.error_reply('ERR ratelimit: this script has no algorithm with code ' .. code)
    end
    local p = {
      limit = tonumber(lim),
      period = tonumber(period),
      burst = tonumber(burst),
      cost = tonumber(cost),
    }
    if not (whole(p.limit, 1) and whole(p.period, 1000) and whole(p.burst, 1)
      and whole(p.cost, 1)) then
      return nil, redis.error_reply('ERR ratelimit: invalid parameters for key ' .. i)
    end
    -- The cost as the decimal text commands take (the fixed window's INCRBY), made
    -- once per parsed limit: formatting a number costs more than the rest of a check's
    -- arithmetic.
    p.cost_text = int(p.cost)
    limit = { algo = algo, code = code, p = p, capacity = p[algo.capacity] }
    -- The period in whole milliseconds as PEXPIRE takes it (fixed_only.lua), when it is.
    if math_fmod(p.period, 1000) == 0 then
      limit.period_ms_text = int(p.period / 1000)
      -- A fixed window that fixed_only.lua decides itself (a cost within the
      -- limit, a period of whole milliseconds): that period in ms, read once
      -- per call there instead of the three tests it stands for.
      if code == 1 and p.cost <= p.limit then
        limit.fixed_ms = p.period / 1000
      end
    end
    if PARSED_COUNT >= PARSED_MAX then
      PARSED = {}
      PARSED_COUNT = 0
    end
    PARSED[spec] = limit
    PARSED_COUNT = PARSED_COUNT + 1
  end
  return limit
end

-- The limits of argv[offset + 1 .. offset + nkeys].
local function parse_limits(argv, offset, nkeys)
  -- Made for one limit, the usual call, not grown one entry at a time: a table
  -- grown so is resized at every power of two (BENCHMARKS.md, "Stacked limits,
  -- tables made to size").
  local limits = { false }
  for i = 1, nkeys do
    local limit, refused = parse_limit(argv[offset + i], i)
    if limit == nil then
      return nil, refused
    end
    limits[i] = limit
  end
  return limits
end

-- Receipts, for the Redis Cluster store's refunds (driver.lua writes them,
-- refund.lua reads them): receipt i of a call is the key
-- `<KEYS[i]>:r:<id>:<i>`, holding "<at µs>:<reset_after µs>:<first µs>:<cost>"
-- (the server's time at the take, the limit's reset_after after it, the
-- decision's `first`, the units the call took), with a TTL of that reset_after,
-- at most RECEIPT_TTL_US. The name holds the key and the value the units: a
-- refund or settle gives back only what this call took of this key.
local RECEIPT_TTL_US = 10000000
local RECEIPT_TTL_MS_TEXT = '10000'

-- The longest this call's receipts live, µs, and as the text of whole ms:
-- RECEIPT_TTL_US, or less when the call asks (call_shape), as a take whose
-- receipts serve only a refund sent when its answer came too late does. Set by
-- call_shape on every call that can write receipts, before any is written: a
-- Functions library's upvalues outlive the call.
local receipt_ttl_us = RECEIPT_TTL_US
local receipt_ttl_text = RECEIPT_TTL_MS_TEXT

-- Whether this call's receipts go in its reply instead of keys: its last
-- argument is `~` (call_shape), as RedisStore::take_briefly sends a take whose
-- receipts serve only the refund of an answer that came too late. The row of
-- each limit of an admitted call then ends with its receipt's figures, the
-- server's time of the take, the reset_after the receipt records and the
-- decision's `first` (µs), which the refund hands back as arguments
-- (refund.lua's `return`): no receipt is written and none is looked for. Set
-- on every call before any row is made: by call_shape (which resets the
-- receipts' TTL too), or by an entry point that reads the call's shape itself
-- (the driver's shortcut, fixed_only.lua).
local receipts_in_reply = false

-- The shape of a check's ARGV (the driver's and the fast paths'): one argument a
-- limit, then optionally the call id, then optionally the longest its receipts
-- live in whole milliseconds (1 to 10000, no leading zero; without it,
-- RECEIPT_TTL_US), each told from a limit by having no ':'; or, instead of
-- those two, `~`: the receipts in the reply (receipts_in_reply).
-- Returns the number of limits and the call id (nil: none), and sets the call's
-- receipt_ttl_us and receipts_in_reply; a malformed receipt TTL reads as no limit at all (0), which
-- the driver refuses.
local function call_shape(argv)
  local n = #argv
  receipt_ttl_us = RECEIPT_TTL_US
  receipt_ttl_text = RECEIPT_TTL_MS_TEXT
  receipts_in_reply = false
  -- A last argument already parsed as a limit (PARSED holds only those, each
  -- with its ':') is a limit: no string search.
  if n > 0 and PARSED[argv[n]] == nil and not string_find(argv[n], ':', 1, true) then
    if argv[n] == '~' then
      receipts_in_reply = true
      return n - 1, nil
    end
    if n > 1 and not string_find(argv[n - 1], ':', 1, true) then
      local keep = argv[n]
      local ms = string_match(keep, '^[1-9]%d?%d?%d?%d?$') and tonumber(keep)
      if not ms or ms * 1000 > RECEIPT_TTL_US then
        return 0, nil
      end
      receipt_ttl_us = ms * 1000
      receipt_ttl_text = keep
      return n - 2, argv[n - 1]
    end
    return n - 1, argv[n]
  end
  return n, nil
end

-- Whether `id` is a well-formed call id: 1 to 32 lower-case hex digits.
local function valid_call_id(id)
  return #id >= 1 and #id <= 32 and not string_find(id, '[^0-9a-f]')
end

local BAD_CALL_ID = 'ERR ratelimit: the call id must be 1 to 32 hex digits'

-- Every number returned is a whole, non-negative integer of at most 2^53 - 1
-- (a wait then gains at most 999 µs: wait_as_answered), and remaining is at
-- most the capacity, whatever the state under the key (written by an older
-- version, by hand, or by a clock that jumped; a fraction there, rounded
-- down). `not (n > 0)` is NaN, a negative and -0 (which a packed row would
-- carry with its sign).
local function clamp(n, max)
  if not (n > 0) then
    return 0
  end
  n = n - n % 1
  if n > 9007199254740991 then
    n = 9007199254740991
  end
  if max ~= nil and n > max then
    return max
  end
  return n
end

-- Whether this call's waits are answered from the start of the server's
-- millisecond, as fixed_only.lua answers its own (the calls it hands to the
-- driver: see there). Set by every entry point whose rows read it (the
-- driver's `check`, refund.lua's `compensate`; fixed_only.lua's own rows count
-- their waits so themselves): a Functions library's upvalues outlive the call.
local waits_from_ms_start = false

-- A wait (µs) as this call answers it (waits_from_ms_start): a wait above 0
-- counted from the start of now's millisecond, so never early.
local function wait_as_answered(us)
  if waits_from_ms_start and us > 0 then
    return us + math_fmod(now, 1000)
  end
  return us
end

-- An admitted call's row as one string (`struct.pack`, which every Redis and
-- Valkey has in its scripts and Functions): the byte 1 (admitted), then its
-- numbers, each a little-endian IEEE 754 double: remaining and reset_after,
-- then with its receipt the time of the take, the receipt's reset_after and
-- `first`; 17 or 41 bytes. wire.rs reads it as a row of four (admitted 1,
-- retry_after 0) or seven numbers, and refuses a string that does not start
-- with the byte 1. Every figure is a whole number below 2^53 + 1000 (clamp,
-- wait_as_answered), which a double holds exactly below 2^53. Packing copies
-- each number's eight bytes, where formatting it as decimal text runs the C
-- library's printf, and a string is cheaper for Redis to answer and for the
-- client to read than a table of numbers (BENCHMARKS.md, "Admitted rows packed
-- as doubles"). The rows of a call not taken (state_reply, block_reply: a
-- rejection, a block, a peek, a replayed take) stay tables. TAKEN_ROW is the
-- format of a row without its receipt, which fixed_only.lua also packs itself
-- (the algorithms' check_one pack theirs through taken_row_now).
local TAKEN_ROW = '<Bdd'

local function taken_row(remaining, reset, at, receipt_reset, first)
  if at == nil then
    return struct_pack(TAKEN_ROW, 1, remaining, reset)
  end
  return struct_pack('<Bddddd', 1, remaining, reset, at, receipt_reset, first)
end

-- The rows of an admitted call of several limits as ONE string: the byte 1,
-- then each limit's numbers as taken_row packs them, one limit after the other
-- (wire.rs cuts them into the call's number of rows), packed by one call
-- instead of a string a row in a table: a string and a table a row cost a
-- stacked call more than its commands' arithmetic. add_taken puts each limit's
-- numbers in TAKEN after the first `count` (TAKEN[1] is the leading 1: a call
-- starts at count 1), and packed_rows packs the first `count`.
--
-- TAKEN and PACK_FORMATS (the format of a call's `count` numbers, by count)
-- are made by the first call that needs them and reused by every call after
-- it, where a Functions library keeps them: a table made per call costs more to
-- allocate and collect than a stacked call's own arithmetic, and a table made
-- by the chunk would be made on every EVAL call (BENCHMARKS.md, "Admitted rows
-- packed as doubles"). Each call writes the numbers it packs before packing
-- them, and packs no more. At most PACK_CHUNK numbers go to one struct.pack:
-- `unpack` and `struct.pack` take their arguments on Lua's stack, which holds a
-- few thousand.
local TAKEN = nil
local PACK_FORMATS = nil
local PACK_CHUNK = 400

local function add_taken(count, remaining, reset, at, receipt_reset, first)
  local numbers = TAKEN
  if numbers == nil then
    numbers = {}
    TAKEN = numbers
  end
  numbers[count + 1] = remaining
  numbers[count + 2] = reset
  if at == nil then
    return count + 2
  end
  numbers[count + 3] = at
  numbers[count + 4] = receipt_reset
  numbers[count + 5] = first
  return count + 5
end

local function packed_rows(count)
  local numbers = TAKEN
  numbers[1] = 1
  if count <= PACK_CHUNK then
    local formats = PACK_FORMATS
    if formats == nil then
      formats = {}
      PACK_FORMATS = formats
    end
    local format = formats[count]
    if format == nil then
      format = '<B' .. string.rep('d', count - 1)
      formats[count] = format
    end
    return struct_pack(format, unpack(numbers, 1, count))
  end
  -- More numbers than one pack takes (a stack of hundreds of limits): in
  -- chunks, the first with the leading byte.
  local parts = {}
  for from = 1, count, PACK_CHUNK do
    local last = math_min(from + PACK_CHUNK - 1, count)
    local format = string.rep('d', last - from + 1)
    if from == 1 then
      format = 'B' .. string.sub(format, 2)
    end
    parts[#parts + 1] = struct_pack('<' .. format, unpack(numbers, from, last))
  end
  return table.concat(parts)
end

-- The figures of limit `l`'s row in a call that was taken (every limit
-- admitted it; decision `d`), as taken_row takes them: remaining and
-- reset_after, then, when its receipt goes in the reply (receipts_in_reply),
-- the time of the take, the receipt's reset_after and `first`, as
-- write_receipt records them; a fixed window's from the start of the take's
-- millisecond, as fixed_only.lua reads them off the window's end without a
-- clock (algorithm::fixed::receipt_in_reply).
local function taken_figures(l, d)
  local remaining = clamp(d.after_remaining, l.capacity)
  local reset = clamp(d.after_reset)
  if receipts_in_reply then
    local at, receipt_reset = now, reset
    if l.code == 1 and reset > 0 then
      local gone = math_fmod(now, 1000)
      at, receipt_reset = now - gone, reset + gone
    end
    return remaining, wait_as_answered(reset), at, receipt_reset, clamp(d.first or 0)
  end
  return remaining, wait_as_answered(reset)
end

-- The packed row of an admitted call that an algorithm's check_one answers (no
-- fixed window, no hand-off from fixed_only.lua): taken_row of taken_figures'
-- figures, for a take at now whose limit has `remaining` and `reset` after it
-- (each clamped as there) and whose decision's `first` is `first`.
local function taken_row_now(remaining, reset, first)
  if receipts_in_reply then
    return struct_pack('<Bddddd', 1, remaining, reset, now, reset, first)
  end
  return struct_pack(TAKEN_ROW, 1, remaining, reset)
end

-- The reply of one limit, {admitted (0/1), remaining, reset_after µs,
-- retry_after µs}, of a call that was not taken (the state as it is); a call
-- that was is answered with its rows packed (taken_row, packed_rows).
local function state_reply(l, d, admitted, retry)
  return { admitted and 1 or 0, clamp(d.now_remaining, l.capacity),
    wait_as_answered(clamp(d.now_reset)), wait_as_answered(clamp(retry)) }
end

-- µs until a key whose PTTL reads `pttl` ms is gone: it goes once the clock
-- passes its expiry millisecond, at now_ms + pttl + 1 ms, i.e. (pttl + 1) ms
-- less the part of the current millisecond already gone (rounded up, never
-- early).
local function expiry_left(pttl)
  return pttl * 1000 + 1000 - math_fmod(now, 1000)
end

-- µs until a key that expires at millisecond `at` (expiry_ms) is gone: once the
-- clock passes that millisecond (never early).
local function left_until(at)
  return (at + 1) * 1000 - now
end

-- Blocks (RateLimiter::block): a key `<key>:b` with a TTL rejects every call on
-- the limit of `key` until it expires, whatever the limit's state `d`; a marker
-- without a TTL (written by someone else) is no block. The reply of limit `l`
-- (whose marker is `marker`, declared in KEYS: see declared_keys) in a call that
-- may hold a block: rejected, nothing left, until the block's end, or else its
-- state as it is; and whether it was blocked.
local function block_reply(marker, l, d)
  local pttl = redis_call('PTTL', marker)
  if pttl >= 0 then
    local left = expiry_left(pttl)
    return { 0, 0, wait_as_answered(math_max(clamp(d.now_reset), left)), wait_as_answered(left) }, true
  end
  return state_reply(l, d, d.admitted, d.retry), false
end

-- The capacity a settle charges its excess under (algorithm::WAIVED_CAPACITY,
-- 2^52: the most a double holds exactly), so that evaluate admits the charge.
local WAIVED_CAPACITY = 4503599627370496

-- ':<i>' for the first limits of a call, written out: a number turned into
-- text is formatted as a double, which costs more than the rest of the name.
local RECEIPT_INDEX = { ':1', ':2', ':3', ':4', ':5', ':6', ':7', ':8' }

local function receipt_key(key, call_id, i)
  return key .. ':r:' .. call_id .. (RECEIPT_INDEX[i] or (':' .. i))
end

-- Writes the receipt `receipt` (declared in KEYS) of decision `d` of limit `l`.
-- Its TTL is the limit's reset_after, at most the call's receipt_ttl_us.
-- Numbers are formatted only where they vary: the time from TIME's digits, a
-- first entry of 0 and the call's longest TTL as constants.
local function write_receipt(receipt, l, d)
  local reset = clamp(d.after_reset)
  local first = d.first
  local first_text = '0'
  if first ~= nil and first ~= 0 then
    first_text = int(first)
  end
  local ttl = receipt_ttl_text
  if reset < receipt_ttl_us then
    ttl = ttl_ms(reset)
  end
  redis_call('SET', receipt,
    now_text() .. ':' .. int(reset) .. ':' .. first_text .. ':' .. l.p.cost_text,
    'PX', ttl)
end

-- A receipt's value as numbers { at, reset, first, cost }, or nil when it is not
-- one (a value without the units taken gives nothing back).
local function read_receipt(value)
  local at, reset, first, cost = string_match(value, '^(%d+):(%d+):(%d+):(%d+)$')
  if not at then
    return nil
  end
  return { at = tonumber(at), reset = tonumber(reset), first = tonumber(first), cost = tonumber(cost) }
end

-- Every key a script touches is declared in the call's KEYS, so that a server or
-- a proxy that routes or locks by the declared keys sees them all (no script
-- builds a key; a test of the stores checks every redis.call of every script):
-- KEYS[1 .. n] are the keys of the call's n limits, then come
--   KEYS[n + i]         the block marker of key i, `<key>:b`;
--   KEYS[copies + i]    (the driver, when a key repeats in the call) the working
--                       copy of key i, `<key>:w`;
--   KEYS[receipts + i]  (with a call id) receipt i of key i under that id,
--                       `<key>:r:<id>:<i>` (receipt_key).
-- Returns where the markers, copies and receipts start (copies and receipts nil
-- when not declared), or nil and the error reply when KEYS are not that. Each
-- declared name is checked against its key (a wrong marker would skip a block,
-- a wrong receipt give back another call's units).
local function declared_keys(KEYS, n, copies_allowed, call_id)
  local receipts = call_id ~= nil and n or 0
  local copies = nil
  if copies_allowed and #KEYS == 3 * n + receipts then
    copies = 2 * n
  elseif #KEYS ~= 2 * n + receipts then
    return nil, redis.error_reply('ERR ratelimit: expected ' .. n .. ' keys, their '
      .. n .. ' block markers' .. (copies_allowed and ', optionally their working copies' or '')
      .. (call_id ~= nil and ' and their receipts' or '') .. '; got ' .. #KEYS .. ' keys')
  end
  if call_id ~= nil then
    receipts = (copies or n) + n
  else
    receipts = nil
  end
  for i = 1, n do
    local key = KEYS[i]
    if KEYS[n + i] ~= key .. ':b'
      or (copies and KEYS[copies + i] ~= key .. ':w')
      or (receipts and KEYS[receipts + i] ~= receipt_key(key, call_id, i)) then
      return nil, redis.error_reply('ERR ratelimit: the keys declared for key ' .. i
        .. ' are not its block marker, working copy or receipt')
    end
  end
  return n, copies, receipts
end
