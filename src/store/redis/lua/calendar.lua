-- Calendar months (src/algorithm/calendar.rs): the proleptic Gregorian calendar from days since
-- the epoch and back, in eras of 400 years with years starting in March.
local DAY = 86400000000

local function civil_from_days(z)
  z = z + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local month = mp + 3
  if mp >= 10 then month = mp - 9 end
  local year = yoe + era * 400
  if month <= 2 then year = year + 1 end
  return year, month
end

local function days_from_civil(year, month)
  if month <= 2 then year = year - 1 end
  local era = floor(year / 400)
  local yoe = year - era * 400
  local doy = floor((153 * ((month + 9) % 12) + 2) / 5)
  return era * 146097 + yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy - 719468
end

local function month_index(t, off)
  local year, month = civil_from_days(div(t + off, DAY))
  return year * 12 + month - 1
end

local function month_start(index, off)
  local year = floor(index / 12)
  return pos(days_from_civil(year, index - year * 12 + 1) * DAY - off)
end
