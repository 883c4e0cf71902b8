-- A block that never shortens another (`Store::extend_block`): KEYS[1] is a limit's block
-- marker (`key:b`), ARGV[1] the block's length in ms. The marker is written only when it
-- would end later than the one it finds; a marker without an expiry (-1) ends never.
local left = redis.call('PTTL', KEYS[1])
local ms = tonumber(ARGV[1])
if left == -1 or left >= ms then
  return 0
end
redis.call('SET', KEYS[1], 1, 'PX', ARGV[1])
return 1
