-- Sliding log (src/algorithm/sliding_log.rs): a flat list { at1, n1, at2, n2, ... }, oldest first.

local function make_log()
  local log = {}

  function log.fresh(p, now)
    return {}
  end

  local function sl_used(p, e, now)
    local used = 0
    for i = 1, #e, 2 do
      if e[i] + p.period > now then used = used + e[i + 1] end
    end
    return used
  end

  -- Smallest wait until `units` fit, with `extra` (a charge admitted now) counted after the log.
  local function sl_wait_for(p, e, now, extra, units)
    local allowed = p.limit - units
    local still = sl_used(p, e, now) + extra
    for i = 1, #e, 2 do
      if e[i] + p.period > now then
        if still <= allowed then return 0 end
        still = still - e[i + 1]
        if still <= allowed then return e[i] + p.period - now end
      end
    end
    if extra > 0 then
      if still <= allowed then return 0 end
      still = still - extra
      if still <= allowed then return p.period end
    end
    return 0
  end

  function log.eval(p, e, now, cost, mode)
    local used = sl_used(p, e, now)
    local kind, wait, charged = 0, 0, cost
    if used + cost > p.limit then
      kind, wait, charged = 2, sl_wait_for(p, e, now, 0, cost), 0
    end
    local remaining = pos(p.limit - (used + charged))
    local reset = 0
    if remaining < p.limit then reset = sl_wait_for(p, e, now, charged, remaining + 1) end
    return kind, wait, p.limit, remaining, reset, remaining, sl_wait_for(p, e, now, charged, p.limit)
  end

  local function sl_prune(p, e, now)
    local first = 1
    while first < #e and e[first] + p.period <= now do first = first + 2 end
    if first == 1 then return e end
    local kept = {}
    for i = first, #e do kept[#kept + 1] = e[i] end
    return kept
  end

  function log.commit(p, e, now, cost)
    e = sl_prune(p, e, now)
    if cost == 0 then return e end
    local n = #e
    if n > 0 and e[n - 1] == now then
      e[n] = e[n] + cost
    else
      e[n + 1] = now
      e[n + 2] = cost
    end
    return e
  end

  function log.refund(p, e, now, units)
    e = sl_prune(p, e, now)
    while units > 0 and #e > 0 do
      local n = #e
      local take = min(units, e[n])
      e[n] = e[n] - take
      units = units - take
      if e[n] == 0 then
        e[n] = nil
        e[n - 1] = nil
      end
    end
    return e
  end

  -- Takes back `units` charged at `at`: from that instant's entry (units of one instant are
  -- interchangeable), so later entries keep their times.
  function log.undo(p, e, now, units, aux, at)
    e = sl_prune(p, e, now)
    for i = 1, #e, 2 do
      if e[i] == at then
        local take = min(units, e[i + 1])
        e[i + 1] = e[i + 1] - take
        if e[i + 1] == 0 then
          table.remove(e, i + 1)
          table.remove(e, i)
        end
        break
      end
    end
    return e
  end

  function log.expires(p, e)
    local n = #e
    if n == 0 then return 0 end
    return e[n - 1] + p.period
  end

  function log.decode(p, raw)
    if string.sub(raw, 1, 1) ~= 'l' then return nil end
    return numbers(raw)
  end

  function log.encode(e)
    local parts = {}
    for i = 1, #e do parts[i] = int(e[i]) end
    return 'l' .. table.concat(parts, ',')
  end

  return log
end
