-- Token bucket (src/algorithm/token_bucket.rs): the state is `e`, the moment the bucket was (or
-- will be) empty, GCRA's tat less the capacity's span; it owes `e + span - now` (at least 0).
-- `b` holds T (emission interval), cap, span = cap * T, init = the initial balance * T.

local function tb_debt(b, e, now)
  return pos(e + b.span - now)
end

local function tb_available(b, debt)
  if debt >= b.span then return 0 end
  return div(b.span - debt, b.T)
end

local function tb_wait_for(b, debt, units)
  local slack = 0
  if units < b.cap then slack = (b.cap - units) * b.T end
  return pos(debt - slack)
end

local function tb_reset(b, debt)
  local a = tb_available(b, debt)
  if a >= b.cap then return 0 end
  return tb_wait_for(b, debt, a + 1)
end

local function tb_refund(b, e, now, units)
  -- units * T is exact below 2^53 and at least 2^53 otherwise: either way the max is right.
  return max(e - units * b.T, now - b.span)
end

local function make_bucket()
  local bucket = {}

  function bucket.fresh(p, now)
    return now - p.init
  end

  function bucket.eval(p, e, now, cost, mode)
    local debt = tb_debt(p, e, now)
    local cost_span = 0
    if cost > 0 then cost_span = p.cost_span end
    local after = debt + cost_span
    local kind, wait
    if after <= p.span then
      kind, wait = 0, 0
    elseif mode == 2 and after <= p.max_after and pos(after - p.span) <= p.max_wait then
      kind, wait = 1, pos(after - p.span)
    elseif mode == 2 then
      -- Past the queue's bound: when it could queue, never later than when it fits outright.
      local could_queue = max(pos(after - p.max_after), pos(after - p.span - p.max_wait))
      kind, wait = 2, min(could_queue, tb_wait_for(p, debt, cost))
    else
      kind, wait = 2, tb_wait_for(p, debt, cost)
    end
    local left = debt
    if kind ~= 2 then left = after end
    local available = tb_available(p, left)
    local balance = available
    if left > p.span then balance = -cdiv(left - p.span, p.T) end
    return kind, wait, p.cap, available, tb_reset(p, left), balance, left
  end

  function bucket.commit(p, e, now, cost)
    if cost == 0 then return max(e, now - p.span) end
    return max(e, now - p.span) + p.cost_span
  end

  function bucket.refund(p, e, now, units)
    return tb_refund(p, e, now, units)
  end

  function bucket.expires(p, e)
    return e + p.span
  end

  function bucket.decode(p, raw)
    if #raw ~= 9 then return nil end
    local tag, e = struct.unpack('<Bd', raw)
    if tag ~= 69 then return nil end -- 'E' (an earlier version's 'T' reads as a new key)
    return e
  end

  function bucket.encode(e)
    return struct.pack('<Bd', 69, e)
  end

  -- Takes back a charge: the state it found, when nothing changed the key since (exactly: a
  -- bucket full for longer than its refill time was charged from full, and a larger capacity
  -- would read the difference), or else the units given back.
  function bucket.undo(p, e, now, units, aux, at, before)
    if e == bucket.commit(p, before, at, units) then return before end
    return tb_refund(p, e, now, units)
  end

  return bucket
end
