-- Deciding, for the charge and the check: every record read with its penalty's block key and
-- numbers and its override (overrides.lua), each candidate evaluated and the better one chosen
-- (a sharded rule's two shards), a blocked key denied; and a denial's offence.

local records = {}
for r = 1, count do
  local rec = read_record()
  if rec.aux > 0 then
    local ds = {}
    for i = 1, rec.aux - 1 do ds[i] = argv[a + i] end
    rec.pen = { key = keys[k], forget = argv[a], ds = ds }
    k = k + 1
    a = a + rec.aux
  end
  if rec.at == 1 then
    override(rec, keys[k])
    k = k + 1
  end
  records[r] = rec
end

-- Evaluates every record, charging nothing; whether all of them are admitted.
local function decide()
  local all = true
  for _, rec in ipairs(records) do
    for j, p in ipairs(rec.c) do
      p.state = state_of(p)
      local res = { p.alg.eval(p, p.state, now, rec.cost, rec.mode) }
      local best = rec.res
      local better
      if not best then
        better = true
      elseif (res[1] ~= 2) ~= (best[1] ~= 2) then
        better = res[1] ~= 2
      elseif res[1] ~= 2 then
        better = res[4] > best[4]
      else
        better = res[2] < best[2]
      end
      if better then
        rec.res = res
        rec.chosen = j
      end
    end
    local pen = rec.pen
    if pen then
      pen.untl, pen.offences = get_block(pen.key)
      if pen.untl and pen.untl > now then
        -- Blocked: denied until the block ends, the counters untouched.
        local left = pen.untl - now
        rec.res = { 2, left, rec.res[3], 0, left, 0, left }
        rec.blocked = true
      end
    end
    if rec.res[1] == 2 then all = false end
  end
  return all
end

-- A record its own rule denied: under a penalty, a charge (not a check) of its key is an
-- offence: `Penalty::offend`, then `Penalty::punish`, and the answer says so.
local function offend(rec)
  local pen = rec.pen
  if pen and not rec.blocked and rec.mode ~= 1 and rec.cost > 0 then
    local offences = 1
    if pen.untl and now < pen.untl + pen.forget then offences = pen.offences + 1 end
    local untl = now + pen.ds[min(offences, #pen.ds)]
    set_block(pen.key, untl, offences, pen.forget)
    local left = untl - now
    local res = rec.res
    rec.res = { 3, max(res[2], left), res[3], 0, max(res[5], left), res[6], max(res[7], left) }
  end
end
