-- Exact division of integers held in doubles (see header.lua), for every general script.
local floor = math.floor

-- floor(a / b) for integers a >= 0, b > 0 with a + b <= 2^53.
local function div(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
