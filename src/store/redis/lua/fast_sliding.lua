-- Sliding window counter (`make_sliding`): now, grace, limit, period, offset, cost. The key
-- is a hash holding its newest window under the window's start (a tag byte and a binary
-- double). Under a limit below 2^26 (every limit written by hand) the field holds both counts,
-- the current one and the previous window's times 2^27 (tag 'P'), so that the one `HINCRBY`
-- that counts a call also answers the previous count; under a larger limit it holds the current
-- count alone (tag 'S') and the previous one is in the field 'p'. The count grows in place, the
-- key keeping the expiry the window's first charge gave it (two periods after the window's
-- start, when both counts have left the sliding period).
-- ARGV[2]: the cost in decimal, for `HINCRBY` (a Lua number passed to Redis is formatted with
-- `%.17g`, which costs more than the rest of a charge's arithmetic).
-- Reply: 2 when denied + 1 when the key was missing, now − window start, the two counts
-- before the charge. A charge inside its window answers them as one integer,
-- ((prev × (limit + 1) + cur) × period + into) × 4 + flags, when it is exact (below 2^53:
-- (limit + 1)² × period below 2^51, as for rules up to about 47,000 units a second, 6,000 a
-- minute or 790 an hour): Redis turns a Lua number into an integer reply for far less than it
-- makes and sends a string.
local now, grace, limit, period, offset, cost = struct.unpack('<dddddd', packed)
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local key = KEYS[1]
-- `window_containing` (windows at offset + k × period).
local ws = now - (now + period - offset) % period
if ws < 0 then ws = 0 end
-- Packed: the current count below 2^26 before a charge below 2^26, so the sum stays below
-- 2^27 and never reaches the previous count's bits (every writer of a packed field keeps both
-- counts below 2^26), and the whole below 2^53, exact in a Lua number.
local SHIFT = 134217728
local packs = limit < 67108864 and cost < 67108864
local tag = 83
if packs then tag = 80 end
local field = struct.pack('<Bd', tag, ws)
-- An error (a value of another algorithm or format) reads as a new key.
local cur = redis.pcall('HINCRBY', key, field, ARGV[2])
local counted = type(cur) == 'number'
if counted and cur ~= cost then
  -- The key holds one window's count at a time (the newest): this window's, counted in place.
  local prev
  if packs then
    local low = cur % SHIFT
    prev = (cur - low) / SHIFT
    cur = low
  else
    prev = redis.call('HGET', key, 'p')
  end
  if prev then
    cur = cur - cost
    prev = prev + 0
    -- A count above the limit (a request brought a lower one since): the current one is kept
    -- and compared with the limit in force (a limit that changes keeps the key's count), as
    -- the Rust keeps it, and only past 2^53 / period (a count made under a shorter period) is
    -- it held there, so that the products below stay exact; the previous window's is forgiven
    -- above the limit (`sw_roll`).
    if prev > limit then prev = limit end
    if cur > limit then
      local most = math.floor(9007199254740991 / period)
      if cur > most then cur = most end
    end
    local into = now - ws
    local room = limit - cur - cost
    -- The previous window's part still inside the sliding period weighs prev × left / period.
    local flags = 0
    if room < 0 or prev * (period - into) > room * period then
      if cost > 0 then redis.call('HINCRBY', key, field, -cost) end
      flags = 2
    end
    -- (Unpacked, the limit is at least 2^26: the integer never fits.)
    if packs and cur <= limit and into < period then
      local n = (prev * (limit + 1) + cur) * period + into
      if n < 2251799813685248 then return n * 4 + flags end
    end
    return struct.pack('<dddd', flags, into, cur, prev)
  end
end

-- The window's first charge, a charge of 0, or a key this path cannot count in: the state is
-- what the key held before this call (its newest window, rolled over to now: `sw_roll`), and
-- the key is written whole, as the general scripts do.
local flags, sws, prev, other = 0, ws, 0, false
-- The stored window's field and value (as its text) and whether it is packed, 'p' as stored,
-- and how many fields the key holds (this call's among them): what a roll-over needs to write
-- only what changed.
local ofield, otext, opacked, oprev, fields
cur = 0
if counted then
  local all = redis.call('HGETALL', key)
  fields = #all
  for i = 1, fields, 2 do
    local f = all[i]
    if f == 'p' then
      oprev = all[i + 1] + 0
    elseif f ~= field and #f == 9 then
      local t, ows = struct.unpack('<Bd', f)
      if (t == 83 or t == 80) and (not other or ows > sws) then
        sws, other, ofield, otext, opacked = ows, true, f, all[i + 1], t == 80
      end
    end
  end
  if other and opacked then
    local n = otext + 0
    cur = n % SHIFT
    prev = (n - cur) / SHIFT
  elseif other and oprev then
    cur, prev = otext + 0, oprev
  elseif oprev and not packs then
    -- This window's count was stored (at zero) before this call.
    sws, cur, prev, other = ws, 0, oprev, false
  else
    -- Nothing this rule wrote: a new key (missing when this call created it).
    sws, cur, prev, other = ws, 0, 0, false
    if fields == 2 and all[2] + 0 == cost then flags = 1 end
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
if sws == ws and cur == 0 and packs and (flags == 1 or other and opacked and fields == 4) then
  -- This call's window, packed, on a key this call created (its field alone) or rolled over
  -- from one holding one other packed window: this call's field holds cur + cost (cur is 0),
  -- so the key is the one written whole below once the other window is gone and the field
  -- holds the previous count too.
  if ofield then redis.call('HDEL', key, ofield) end
  if prev ~= 0 then redis.call('HSET', key, field, string.format('%d', prev * SHIFT + cost)) end
elseif sws == ws and cur == 0 and not packs
  and (flags == 1 or other and not opacked and oprev and fields == 6) then
  -- The same for a key of the unpacked format: 'p' and one other window. 'p' is left alone
  -- when the count it holds stays (a key called at a steady rate), and written as text when it
  -- can be (a number is formatted by Redis, see ARGV[2]). The same bytes either way: counts are
  -- integers below 2^53, which `%.17g` writes as their decimal digits.
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
  if packs then
    redis.call('HSET', key, struct.pack('<Bd', 80, sws), cur + cost + prev * SHIFT)
  else
    redis.call('HSET', key, struct.pack('<Bd', 83, sws), cur + cost, 'p', prev)
  end
end
redis.call('PEXPIRE', key, string.format('%d', px + grace))
return struct.pack('<dddd', flags, into, cur, prev)
