-- ratelimit: the driver. Checks every limit of ONE call, writes only when all
-- admit (a rejected call leaves every key as it was), and returns, per limit,
-- {admitted (0/1), remaining, reset_after µs, retry_after µs}.
--
-- ARGV holds 5 arguments per key (see the prelude), then optionally a call id
-- ([0-9a-f], at most 32): with one, an admitted call also leaves a receipt per
-- limit, `<key>:r:<id>:<i>` = "<now µs>:<reset_after µs>:<first µs>", whose TTL
-- is reset_after (the longest the call can hold anything of that limit), at
-- most RECEIPT_TTL_US: a refund comes within one cross-slot check, and a refund
-- that finds no receipt gives back nothing (never too much). The
-- Redis Cluster store takes limits that fall in several slots one slot at a
-- time, and gives back through these receipts what an earlier slot took when a
-- later one rejects (refund.lua).
local nkeys = #KEYS
local call_id = nil
if #ARGV == 5 * nkeys + 1 then
  call_id = ARGV[#ARGV]
  if #call_id < 1 or #call_id > 32 or string.find(call_id, '[^0-9a-f]') then
    return redis.error_reply('ERR ratelimit: the call id must be 1 to 32 hex digits')
  end
elseif nkeys == 0 or #ARGV ~= 5 * nkeys then
  return redis.error_reply('ERR ratelimit: expected 5 arguments per key, got ' .. #ARGV .. ' for ' .. nkeys .. ' keys')
end

local limits = {}
local repeated = false
local seen = {}
for i = 1, nkeys do
  local base = 5 * (i - 1)
  local code = tonumber(ARGV[base + 1])
  local algo = ALGOS[code]
  if algo == nil then
    return redis.error_reply('ERR ratelimit: this script has no algorithm with code ' .. tostring(ARGV[base + 1]))
  end
  local p = {
    limit = tonumber(ARGV[base + 2]),
    period = tonumber(ARGV[base + 3]),
    burst = tonumber(ARGV[base + 4]),
    cost = tonumber(ARGV[base + 5]),
  }
  if not (p.limit and p.period and p.burst and p.cost)
    or p.limit < 1 or p.period < 1000 or p.burst < 1 or p.cost < 1 then
    return redis.error_reply('ERR ratelimit: invalid parameters for key ' .. i)
  end
  limits[i] = { algo = algo, p = p }
  if seen[KEYS[i]] then
    repeated = true
  end
  seen[KEYS[i]] = true
end

-- Every number returned is a whole, non-negative integer, and remaining is at
-- most the capacity, whatever the state under the key (written by an older
-- version, by hand, or by a clock that jumped).
local function clamp(n, max)
  if n ~= n or n < 0 then
    return 0
  end
  if max ~= nil and n > max then
    return max
  end
  return n
end

local function capacity(i)
  local l = limits[i]
  if l.algo.bucket then
    return l.p.burst
  end
  return l.p.limit
end

local function taken_reply(i, d)
  return { 1, clamp(d.after_remaining, capacity(i)), clamp(d.after_reset), 0 }
end

local function state_reply(i, d, admitted, retry)
  return { admitted and 1 or 0, clamp(d.now_remaining, capacity(i)), clamp(d.now_reset), clamp(retry) }
end

local RECEIPT_TTL_US = 10000000

local function write_receipts(decisions)
  if call_id == nil then
    return
  end
  for i = 1, nkeys do
    local d = decisions[i]
    local first = 0
    if type(d.write) == 'table' and d.write.first then
      first = d.write.first
    end
    redis.call('SET', KEYS[i] .. ':r:' .. call_id .. ':' .. i,
      int(now) .. ':' .. int(clamp(d.after_reset)) .. ':' .. int(first),
      'PX', ttl_ms(math.min(clamp(d.after_reset), RECEIPT_TTL_US)))
  end
end

local decisions = {}
local reply = {}

if not repeated then
  -- The usual case: distinct keys. Evaluate all, then write all or nothing.
  local all = true
  for i = 1, nkeys do
    decisions[i] = limits[i].algo.evaluate(KEYS[i], limits[i].p)
    if not decisions[i].admitted then
      all = false
    end
  end
  for i = 1, nkeys do
    local d = decisions[i]
    if all then
      limits[i].algo.commit(KEYS[i], limits[i].p, d)
      reply[i] = taken_reply(i, d)
    else
      reply[i] = state_reply(i, d, d.admitted, d.retry)
    end
  end
  if all then
    write_receipts(decisions)
  end
  return reply
end

-- One key named more than once: its limits apply one after the other, each
-- seeing what the ones before it took (as the memory store does). Each limit
-- that admits is written at once; when any rejects, every key written is put
-- back exactly as it was (DUMP before the first write, RESTORE after), and the
-- reply reads the state as it is.
local saved = {}
local saved_keys = {}
local all = true
local outcome = {}
for i = 1, nkeys do
  local key = KEYS[i]
  local d = limits[i].algo.evaluate(key, limits[i].p)
  decisions[i] = d
  outcome[i] = { admitted = d.admitted, retry = d.retry }
  if d.admitted then
    if saved[key] == nil then
      local dump = redis.call('DUMP', key)
      if dump then
        saved[key] = { dump = dump, pttl = redis.call('PTTL', key) }
      else
        saved[key] = false
      end
      saved_keys[#saved_keys + 1] = key
    end
    limits[i].algo.commit(key, limits[i].p, d)
  else
    all = false
  end
end
if all then
  for i = 1, nkeys do
    reply[i] = taken_reply(i, decisions[i])
  end
  write_receipts(decisions)
  return reply
end
for _, key in ipairs(saved_keys) do
  local s = saved[key]
  if s then
    local ttl = s.pttl
    if ttl < 0 then
      ttl = 0
    end
    redis.call('RESTORE', key, ttl, s.dump, 'REPLACE')
  else
    redis.call('DEL', key)
  end
end
for i = 1, nkeys do
  local d = limits[i].algo.evaluate(KEYS[i], limits[i].p)
  reply[i] = state_reply(i, d, outcome[i].admitted, outcome[i].retry)
end
return reply
