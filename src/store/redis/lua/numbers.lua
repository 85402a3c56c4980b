-- Helpers of the scripts that run the algorithms: rounding up, decimal digits, clamps, the
-- encodings' decimal lists and the window containing a time.

local function cdiv(a, b)
  return div(a + b - 1, b)
end

-- The decimal digits of an integer below 2^53 ('%d' is exact there, and cheaper than '%.0f').
local function int(x)
  return string.format('%d', x)
end

local function pos(x)
  if x < 0 then return 0 end
  return x
end

local function min(a, b)
  if a < b then return a end
  return b
end

local function max(a, b)
  if a > b then return a end
  return b
end

-- Encoding: a token bucket's state is a tag byte ('E') and its number as a little-endian double;
-- a fixed window's and a sliding window's, a hash (see fast_fixed.lua, fast_sliding.lua); a
-- sliding log's and a burst pool's, a tag letter ('l', 'P') and decimal integers separated by
-- commas. A value of another algorithm, format or type reads as a new key.

local function numbers(raw)
  local out = {}
  for digits in string.gmatch(raw, '%-?%d+') do out[#out + 1] = tonumber(digits) end
  return out
end

-- The start of the window containing `now`, for windows at offset + k * period.
local function window_containing(now, offset, period)
  local into = now + period - offset
  into = into - div(into, period) * period
  return pos(now - into)
end
