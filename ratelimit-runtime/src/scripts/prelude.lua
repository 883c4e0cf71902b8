-- ratelimit: prelude shared by every script (SPEC §4).
--
-- One script checks every limit of ONE call: KEYS[i] is the key of limit i and
-- ARGV[5*(i-1)+1 .. 5*i] its parameters: algorithm code, limit, period (µs),
-- burst, cost. Time is the server's own (`TIME`), in microseconds, so app
-- servers with skewed clocks share one consistent limit.
--
-- Numbers: Lua numbers are doubles, exact for integers up to 2^53 (µs since the
-- epoch fit with centuries to spare). Every number handed to Redis goes through
-- `int()` because Lua turns numbers into strings with 14 significant digits,
-- which would round a µs timestamp. Every number returned is an integer.

-- Before Redis 5, a script that writes after a non-deterministic command such as
-- TIME must switch to effects replication first; from Redis 5 on it is the
-- default (and from 7 on the function is a no-op kept for compatibility).
if redis.replicate_commands ~= nil then
  redis.replicate_commands()
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- A whole number as a decimal string, exact up to 2^53.
local function int(n)
  return string.format('%.0f', n)
end

-- a / b rounded up, for non-negative integers a and b > 0 below 2^53. The
-- double division may round the quotient to the wrong side of a whole number
-- when a is large; the remainder, exact in integers, puts it right.
local function ceil_div(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r > 0 then
    return q + 1
  end
  if r <= -b then
    return q - 1
  end
  return q
end

-- Greatest common divisor of two positive integers (exact below 2^53).
local function gcd(a, b)
  while b > 0 do
    a, b = b, math.fmod(a, b)
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

-- Algorithms by code (Algorithm::code() on the Rust side). Each entry has
--   evaluate(key, p) -> decision: reads only. `p` holds limit, period (µs),
--       burst, cost. The decision holds `admitted`, `now_remaining` and
--       `now_reset` (the state as it is), `after_remaining` and `after_reset`
--       (the state once the call is taken, when admitted), `retry` (µs until
--       the same call would be admitted, when rejected) and `write`, what
--       commit needs.
--   commit(key, p, d) : the writes, each with its TTL.
--   bucket: true for the buckets, whose capacity is `burst` (else `limit`).
--
-- State stamped in the future (a failover to a replica whose clock is behind
-- the old master's) is treated as stamped now: evaluate rewrites its stamps to
-- now before deciding, never counting the skew as a charge, so no caller is
-- locked out beyond the true retry_after. That rewrite is the only write a
-- rejected call can make, and it never changes what the state admits.
local ALGOS = {}
