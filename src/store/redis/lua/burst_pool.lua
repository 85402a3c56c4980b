-- Burst pool (src/algorithm/burst_pool.rs): { s = steady bucket's state, p = pool's }; p.steady
-- and p.pool are token buckets.

local function make_pool()
  local pool = {}

  function pool.fresh(p, now)
    return { s = now - p.steady.init, p = now - p.pool.init }
  end

  local function bp_available(p, st, now)
    return tb_available(p.steady, tb_debt(p.steady, st.s, now)),
      tb_available(p.pool, tb_debt(p.pool, st.p, now))
  end

  local function bp_split(p, st, now, cost)
    local steady, spare = bp_available(p, st, now)
    local from_steady = min(cost, steady)
    local from_pool = cost - from_steady
    if from_pool <= spare then return from_steady, from_pool end
    return nil
  end

  local function bp_wait_in(b, e, now, units)
    if units == 0 then return 0 end
    if units > b.cap then return math.huge end
    return tb_wait_for(b, tb_debt(b, e, now), units)
  end

  local function bp_wait_for(p, st, now, units)
    local function steady_wait(k) return bp_wait_in(p.steady, st.s, now, k) end
    local function pool_wait(k) return bp_wait_in(p.pool, st.p, now, units - k) end
    local lo, hi = 0, min(units, p.steady.cap)
    while lo < hi do
      local mid = lo + div(hi - lo, 2)
      if steady_wait(mid) >= pool_wait(mid) then hi = mid else lo = mid + 1 end
    end
    local function at(k) return max(steady_wait(k), pool_wait(k)) end
    local best = at(lo)
    if lo > 0 then best = min(best, at(lo - 1)) end
    return best
  end

  function pool.commit(p, st, now, cost)
    local from_steady, from_pool = bp_split(p, st, now, cost)
    if from_steady == nil then from_steady, from_pool = cost, 0 end
    return {
      s = max(st.s, now - p.steady.span) + from_steady * p.steady.T,
      p = max(st.p, now - p.pool.span) + from_pool * p.pool.T,
    }, from_steady
  end

  function pool.eval(p, st, now, cost, mode)
    local kind, wait, left = 0, 0, st
    if bp_split(p, st, now, cost) ~= nil then
      left = pool.commit(p, st, now, cost)
    else
      kind, wait = 2, bp_wait_for(p, st, now, cost)
    end
    local steady, spare = bp_available(p, left, now)
    local remaining = steady + spare
    local capacity = p.steady.cap + p.pool.cap
    local reset = 0
    if remaining < capacity then reset = bp_wait_for(p, left, now, remaining + 1) end
    local full_in = max(tb_debt(p.steady, left.s, now), tb_debt(p.pool, left.p, now))
    return kind, wait, capacity, remaining, reset, remaining, full_in
  end

  function pool.refund(p, st, now, units)
    -- The whole units the pool misses, rounded down so that none is lost to its cap.
    local room = div(tb_debt(p.pool, st.p, now), p.pool.T)
    local to_pool = min(units, min(room, p.pool.cap))
    return {
      s = tb_refund(p.steady, st.s, now, units - to_pool),
      p = tb_refund(p.pool, st.p, now, to_pool),
    }
  end

  -- Takes back a charge: the state it found, when nothing changed the key since (see
  -- `bucket.undo`), or else `aux` units to the steady bucket and the rest to the pool.
  function pool.undo(p, st, now, units, aux, at, before_s, before_p)
    local before = { s = before_s, p = before_p }
    local again = pool.commit(p, before, at, units)
    if again.s == st.s and again.p == st.p then return before end
    return {
      s = tb_refund(p.steady, st.s, now, aux),
      p = tb_refund(p.pool, st.p, now, units - aux),
    }
  end

  function pool.expires(p, st)
    return max(st.s + p.steady.span, st.p + p.pool.span)
  end

  function pool.decode(p, raw)
    -- 'P' (an earlier version's 'p', its two tats, reads as a new key)
    if string.sub(raw, 1, 1) ~= 'P' then return nil end
    local n = numbers(raw)
    return { s = n[1], p = n[2] }
  end

  function pool.encode(st)
    return 'P' .. int(st.s) .. ',' .. int(st.p)
  end

  return pool
end
