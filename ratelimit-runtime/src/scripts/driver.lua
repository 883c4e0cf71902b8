-- ratelimit: the driver. Evaluates every limit of the call, writes only when all
-- admit (a rejected call leaves every key as it was), and returns, per limit,
-- {admitted (0/1), remaining, reset_after µs, retry_after µs}.
local nkeys = #KEYS
if nkeys == 0 or #ARGV ~= 5 * nkeys then
  return redis.error_reply('ERR ratelimit: expected 5 arguments per key, got ' .. #ARGV .. ' for ' .. nkeys .. ' keys')
end

local limits = {}
local decisions = {}
local all = true
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
  local d = algo.evaluate(KEYS[i], p)
  decisions[i] = d
  if not d.admitted then
    all = false
  end
end

local reply = {}
for i = 1, nkeys do
  local d = decisions[i]
  if all then
    limits[i].algo.commit(KEYS[i], limits[i].p, d)
    reply[i] = { 1, d.after_remaining, d.after_reset, 0 }
  else
    reply[i] = { d.admitted and 1 or 0, d.now_remaining, d.now_reset, d.retry }
  end
end
return reply
