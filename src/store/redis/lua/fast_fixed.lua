-- Fixed window whose capacity is its limit (`make_fixed`): now, grace, rate, period, capacity,
-- offset, cost. A fixed window's key is a hash: one field, the window's start ('W' and a
-- binary double), holding the units used in that window (more than the capacity only under a
-- capacity below the one that counted them; a reservation reaching into later windows is counted
-- in the window that pays its last unit, see fixed_window.lua). The window's count grows in
-- place (`HINCRBY`): the key keeps the expiry its
-- window's first charge gave it (the end of the window, when a key of a window's units is
-- a new key's again), so a charge inside a window writes nothing else.
-- ARGV[2]: the cost in decimal, for `HINCRBY` (see fast_sliding.lua).
-- Reply: 2 when denied + 1 when the key was missing, now − window start (negative for a later
-- window a reservation holds), the units left in that window before the charge. A charge inside
-- its window answers them as one integer, ((left × period) + into) × 4 + flags, when it is
-- exact (below 2^53: units left × period below 2^51, as for rules up to about 3.7 × 10^7 units
-- a minute or 6 × 10^5 an hour): Redis turns a Lua number into an integer reply for far less
-- than it makes and sends a string.
local now, grace, rate, period, cap, offset, cost = struct.unpack('<ddddddd', packed)
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local key = KEYS[1]
-- `window_containing` (windows at offset + k × period).
local ws = now - (now + period - offset) % period
if ws < 0 then ws = 0 end
local field = struct.pack('<Bd', 87, ws)
-- An error (a value of another algorithm or format) reads as a new key.
local used = redis.pcall('HINCRBY', key, field, ARGV[2])
local counted = type(used) == 'number'
if counted and used ~= cost then
  local flags, into, left = 0, now - ws, cap - used + cost
  if used > cap then
    -- Denied: nothing charged. (A cost of 0 changed nothing; "-0" is not an integer to Redis.)
    if cost > 0 then redis.call('HINCRBY', key, field, -cost) end
    flags = 2
  end
  local n = left * period + into
  if left >= 0 and into < period and n < 2251799813685248 then return n * 4 + flags end
  return struct.pack('<ddd', flags, into, left)
end

-- The window's first charge, a charge of 0, or a key this path cannot count in: the state is
-- what the key held before (its newest other window, `fw_roll`), and the key is written whole,
-- as the general scripts do. The reply's state is that window's start and units left: the
-- window containing now, or a later one a reservation holds.
local flags, sws, rem = 1, ws, cap
-- Units left in the window containing now, which starts at `at` on the key's grid.
local left, at = cap, ws
if counted then
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local f = all[i]
    if f ~= field and #f == 9 then
      local tag, ows = struct.unpack('<Bd', f)
      if tag == 87 and (flags == 1 or ows > sws) then
        flags, sws, rem = 0, ows, cap - all[i + 1]
      end
    end
  end
  if flags == 0 then
    if now - sws >= period then
      -- `fw_roll` from the stored window to the one containing now: what it counted, at most
      -- the capacity (a count above a lowered one is forgiven when its window ends), paid back
      -- by each window since.
      local into = (now - sws) % period
      local windows = (now - sws - into) / period
      sws = now - into
      if rem < 0 then rem = 0 end
      -- (A product past 2^53 is inexact, but then far above cap - rem: the comparison holds.)
      if windows * rate >= cap - rem then
        rem = cap
      else
        rem = rem + windows * rate
      end
      left, at = rem, sws
    elseif now < sws then
      -- A reservation holds the windows from the one containing now to the stored one
      -- (within the first windows after the epoch, from the first on the grid).
      local gap = sws - now
      local ahead = (gap - gap % period) / period
      if gap % period > 0 then ahead = ahead + 1 end
      local most = (sws - sws % period) / period
      if ahead > most then ahead = most end
      left, at = rem - ahead * rate, sws - ahead * period
    else
      left, at = rem, sws
    end
  end
else
  flags = 0
end
if left < cost then
  -- Denied: the key as it was. This call's field held nothing before it (or it would have
  -- been counted above): remove it again.
  if counted then redis.call('HDEL', key, field) end
  return struct.pack('<ddd', 2 + flags, now - sws, rem)
end
-- The key expires when the window that fills it again starts (never sooner than 1 ms).
local owed = cap - left + cost + rate - 1
local px = at + (owed - owed % rate) / rate * period - now + 999
px = (px - px % 1000) / 1000
if px < 1 then px = 1 end
redis.call('DEL', key)
redis.call('HSET', key, struct.pack('<Bd', 87, at), cap - left + cost)
redis.call('PEXPIRE', key, string.format('%d', px + grace))
return struct.pack('<ddd', flags, now - sws, rem)
