-- ratelimit: the check of a call of ONE GCRA limit without a call id, the
-- usual call, reading only what the rule needs. The rule's home is gcra.lua
-- (and algorithm/gcra.rs); this is its second home for that one case, held to
-- it decision by decision by the conformance test.
--
-- KEYS and ARGV are the driver's for one limit (the key, its block marker;
-- code, limit, period µs, burst, cost), so that whatever this path does not
-- decide itself goes to the driver's `check` on the same KEYS and ARGV, in the
-- same script (atomic): a call id, a key of another type, a backlog past the
-- tolerance (below), and any argument or key the driver would refuse.
--
-- Time: this path reads no clock (TIME costs more than the rest of its Lua).
-- gcra.lua keeps the tat in the key's expiry millisecond and its microseconds
-- in the value, so the key's PTTL, counted from the server's own millisecond,
-- gives the backlog from the start of that millisecond, and SET … PX writes the
-- new tat from the same millisecond. The call is decided at the start of the
-- millisecond those count from (algorithm::gcra::redis_decides_at, the
-- conformance test's statement of it): the rule at an instant less than 1 ms before the
-- answer, so its waits are never early and at most 1 ms late. Redis 6.2 and
-- 7.0 count PTTL and PX from the live clock, later ones from the command's
-- snapshot of it: one clock per engine either way, so the backlog read and the
-- tat written agree (a server paused between the two writes a later tat, never
-- an earlier one).

local function gcra_only(KEYS, ARGV)
  local key = KEYS[1]
  if #ARGV ~= 5 or #KEYS ~= 2 or ARGV[1] ~= '5' or KEYS[2] ~= key .. ':b' then
    return check(KEYS, ARGV)
  end
  local l = parse_limit(ARGV, 0, 1)
  if l == nil then
    return check(KEYS, ARGV)
  end
  local blocked = redis.call('EXISTS', KEYS[2]) == 1
  local p = l.p
  local t = l.gcra_t
  if t == nil then
    t = gcra_interval(p)
    l.gcra_t = t
  end
  local tau = p.burst * t
  -- The backlog from the start of the server's millisecond, read as gcra.lua's
  -- gcra_read reads the tat (the expiry millisecond less one, in µs, plus the
  -- stored microseconds; no number or no expiry: no state). Not ahead of now
  -- (or not a number at all): no backlog. More than a full backlog: the driver
  -- decides at its exact instant (it is either a backlog a call decided at its
  -- exact instant earlier in this millisecond left, which is the bucket's, or a
  -- clock ahead, which the driver brings back); from the millisecond's start,
  -- bringing it back would give away the part of the millisecond gone.
  local backlog = 0
  local value = redis.pcall('GET', key)
  if type(value) == 'table' then
    -- Another type: the driver answers (its error).
    return check(KEYS, ARGV)
  end
  local us = value and tonumber(value)
  if us then
    local pttl = redis.call('PTTL', key)
    if pttl >= 0 then
      backlog = (pttl - 1) * 1000 + us
      if backlog > tau then
        return check(KEYS, ARGV)
      elseif not (backlog > 0) then
        backlog = 0
      end
    end
  end
  -- A block (a marker with a TTL; one without is none): rejected, nothing
  -- left, until the block's end (the driver's block_reply, from the start of
  -- the millisecond).
  if blocked then
    local pttl = redis.call('PTTL', KEYS[2])
    if pttl >= 0 then
      local left = pttl * 1000 + 1000
      return { 0, 0, math.max(backlog, left), left }
    end
  end
  local after = backlog + p.cost * t
  if after > tau then
    return { 0, clamp(p.burst - ceil_div(backlog, t), p.burst), backlog, after - tau }
  end
  redis.call('SET', key, int(math.fmod(after, 1000)), 'PX', int(floor_div(after, 1000) + 1))
  return { 1, clamp(p.burst - ceil_div(after, t), p.burst), after, 0 }
end
