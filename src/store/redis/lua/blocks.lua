-- Blocks (src/algorithm/penalty.rs): a rule with a penalty keeps, beside the counters, a key
-- 'until,offences'. While `until` is ahead, the rule denies the key without reading its
-- counters; a charge the rule denies otherwise is an offence and starts a block. The key
-- expires when its offences are forgotten (forget_after after `until`).

local function set_block(key, untl, offences, forget)
  local px = div(untl + forget - now + 999, 1000)
  if px < 1 then px = 1 end
  redis.call('SET', key, string.format('%d,%d', untl, offences), 'PX', string.format('%d', px + grace))
end

local function get_block(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  local untl, offences = string.match(raw, '^(%d+),(%d+)$')
  if untl == nil then return nil end
  return tonumber(untl), tonumber(offences)
end

