-- Sliding window counter (`make_sliding`): now, grace, limit, period, offset, cost. The key
-- is a hash: the current window's count under its start ('S' and a binary double), and the
-- previous window's under 'p'. The count grows in place (`HINCRBY`), the key keeping the
-- expiry the window's first charge gave it (two periods after the window's start, when both
-- counts have left the sliding period).
-- ARGV[2]: the cost in decimal, for `HINCRBY` (a Lua number passed to Redis is formatted with
-- `%.17g`, which costs more than the rest of a charge's arithmetic).
-- Reply: 2 when denied + 1 when the key was missing, now − window start, the two counts
-- before the charge.
local now, grace, limit, period, offset, cost = struct.unpack('<dddddd', packed)
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local key = KEYS[1]
-- `window_containing` (windows at offset + k × period).
local ws = now - (now + period - offset) % period
if ws < 0 then ws = 0 end
local field = struct.pack('<Bd', 83, ws)
-- An error (a value of another algorithm or format) reads as a new key.
local cur = redis.pcall('HINCRBY', key, field, ARGV[2])
local counted = type(cur) == 'number'
if counted and cur ~= cost then
  -- The key holds one window's count at a time (the newest): this window's, counted in place.
  local prev = redis.call('HGET', key, 'p')
  if prev then
    cur = cur - cost
    prev = prev + 0
    -- A count above the limit (a request brought a lower one since): the current one is kept
    -- and compared with the limit in force (a limit that changes keeps the key's count), as the Rust keeps it, and only past
    -- 2^53 / period (a count made under a shorter period) is it held there, so that the products
    -- below stay exact; the previous window's is forgiven above the limit (`sw_roll`).
    if prev > limit then prev = limit end
    if cur > limit then
      local most = math.floor(9007199254740991 / period)
      if cur > most then cur = most end
    end
    local into = now - ws
    local room = limit - cur - cost
    -- The previous window's part still inside the sliding period weighs prev × left / period.
    if room < 0 or prev * (period - into) > room * period then
      if cost > 0 then redis.call('HINCRBY', key, field, -cost) end
      return struct.pack('<dddd', 2, into, cur, prev)
    end
    return struct.pack('<dddd', 0, into, cur, prev)
  end
end

-- The window's first charge, a charge of 0, or a key this path cannot count in: the state is
-- what the key held before this call (its newest window, rolled over to now: `sw_roll`), and
-- the key is written whole, as the general scripts do.
local flags, sws, prev, other = 0, ws, 0, false
-- The stored window's field and count (as its text), 'p' as stored, and how many fields the
-- key holds (this call's among them): what a roll-over needs to write only what changed.
local ofield, otext, oprev, fields
cur = 0
if counted then
  local all = redis.call('HGETALL', key)
  fields = #all
  local stored = false
  for i = 1, fields, 2 do
    local f = all[i]
    if f == 'p' then
      prev, stored = all[i + 1] + 0, true
      oprev = prev
    elseif f ~= field and #f == 9 then
      local tag, ows = struct.unpack('<Bd', f)
      if tag == 83 and (not other or ows > sws) then
        sws, cur, other, ofield, otext = ows, all[i + 1] + 0, true, f, all[i + 1]
      end
    end
  end
  if not stored then
    -- Nothing this rule wrote: a new key (missing when this call created it).
    sws, cur, prev, other = ws, 0, 0, false
    if fields == 2 and all[2] + 0 == cost then flags = 1 end
  elseif not other then
    -- This window's count was stored (at zero) before this call.
    cur = 0
  end
  if cur > limit or prev > limit then
    -- Kept above the limit as above, within 2^53 / period.
    local most = math.floor(9007199254740991 / period)
    if cur > most then cur = most end
    if prev > most then prev = most end
  end
  if now - sws >= period then
    local into = (now - sws) % period
    if now - sws - into == period then prev = cur else prev = 0 end
    sws, cur = now - into, 0
  end
  -- A window that has ended weighs at most the limit in force (`sw_roll`).
  if prev > limit then prev = limit end
end
local into = now - sws
local left = period - into
if left > period then left = period end
local room = limit - cur - cost
if room < 0 or prev * left > room * period then
  -- Denied: the key as it was.
  if counted then
    if other or sws ~= ws then
      redis.call('HDEL', key, field)
    elseif cost > 0 then
      redis.call('HINCRBY', key, field, -cost)
    end
    if flags == 1 then redis.call('DEL', key) end
  end
  return struct.pack('<dddd', 2 + flags, into, cur, prev)
end
-- The key expires when both counts have left the sliding period (never sooner than 1 ms).
local expires = sws + 2 * period
if cur + cost == 0 then
  expires = sws
  if prev > 0 then expires = sws + period end
end
local px = expires - now + 999
px = (px - px % 1000) / 1000
if px < 1 then px = 1 end
if sws == ws and cur == 0 and (flags == 1 or other and fields == 6) then
  -- This call's window, on a key this call created (its field alone) or rolled over from one
  -- holding 'p' and one other window (what this path and the general scripts write): this
  -- call's field already holds cur + cost (cur is 0), so the key is the one written whole below
  -- once the other window is gone and 'p' holds prev. Written in place, it is at most one `HDEL`
  -- and one `HSET` instead of a key deleted and made again; 'p' is left alone when the count it
  -- holds stays (a key called at a steady rate), and written as text when it can be (a number
  -- is formatted by Redis, see ARGV[2]). The same bytes either way: counts are integers below
  -- 2^53, which `%.17g` writes as their decimal digits.
  if ofield then redis.call('HDEL', key, ofield) end
  if prev ~= oprev then
    local text = prev
    if prev == 0 then
      text = '0'
    elseif otext and prev == otext + 0 then
      text = otext
    end
    redis.call('HSET', key, 'p', text)
  end
else
  redis.call('DEL', key)
  if sws ~= ws then field = struct.pack('<Bd', 83, sws) end
  redis.call('HSET', key, field, cur + cost, 'p', prev)
end
redis.call('PEXPIRE', key, string.format('%d', px + grace))
return struct.pack('<dddd', flags, into, cur, prev)
