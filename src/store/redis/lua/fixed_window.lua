-- Fixed window (src/algorithm/fixed_window.rs): { ws = window start, rem = units left under this
-- call's capacity }. The key keeps the units spent (`FixedWindowState::spent`), read as
-- `rem = cap − spent` under whatever limit the call brings (a limit that changes keeps the count: a window's count compared
-- with the limit in force; a count above a lowered capacity is forgiven when its window ends). A
-- reservation that reaches into later windows moves `ws` to the window paying its last unit: the
-- windows before it are held. `p.owed` and `p.max_wait` bound a reservation (see `params::push`).

local function make_fixed()
  local fixed = {}

  -- The start of the `k`-th window after the one starting at `ws` (`FixedWindow::boundary`).
  local function fw_boundary(p, ws, k)
    if p.period > 0 then return ws + k * p.period end
    return month_start(month_index(ws, p.off) + min(k, 120000), p.off)
  end

  -- Window starts in (ws, now] (`FixedWindow::windows_between`).
  local function fw_between(p, ws, now)
    if now <= ws then return 0 end
    if p.period > 0 then return div(now - ws, p.period) end
    return month_index(now, p.off) - month_index(ws, p.off)
  end

  function fixed.fresh(p, now)
    if p.period == 0 then
      return { ws = month_start(month_index(now, p.off), p.off), rem = p.cap }
    end
    return { ws = window_containing(now, p.offset, p.period), rem = p.cap }
  end

  -- A state read at `now` (`FixedWindow::roll`): { st = start of now's window, sp = units spent
  -- in the state's window, ah = windows from `st` to it (a reservation's) }. Each window after
  -- the state's pays back `limit` of at most the capacity.
  local function fw_roll(p, s, now)
    local sp = p.cap - s.rem
    if now >= s.ws then
      local windows = fw_between(p, s.ws, now)
      if windows == 0 then return { st = s.ws, sp = sp, ah = 0 } end
      -- (A product past 2^53 is inexact, but then far above the capacity: the result is 0.)
      return { st = fw_boundary(p, s.ws, windows), sp = pos(min(sp, p.cap) - windows * p.limit), ah = 0 }
    end
    if p.period > 0 then
      local ah = min(cdiv(s.ws - now, p.period), div(s.ws, p.period))
      return { st = s.ws - ah * p.period, sp = sp, ah = ah }
    end
    local index = month_index(now, p.off)
    return { st = month_start(index, p.off), sp = sp, ah = pos(month_index(s.ws, p.off) - index) }
  end

  -- Units held seen from `r.st` (`FixedWindow::held`).
  local function fw_held(p, r)
    return r.sp + r.ah * p.limit
  end

  -- A count above the capacity forgiven (`FixedWindow::forgiven`).
  local function fw_forgiven(p, r)
    return { st = r.st, sp = min(r.sp, p.cap), ah = r.ah }
  end

  -- `held` units seen from `st`, in the window paying the last of them, at most `most` ahead
  -- (`FixedWindow::settle`).
  local function fw_settle(p, st, held, most)
    held = pos(held)
    local ah = 0
    if held > p.cap then ah = min(cdiv(held - p.cap, p.limit), most) end
    return { st = st, sp = pos(held - ah * p.limit), ah = ah }
  end

  -- After a charge of `cost` (`FixedWindow::charged`).
  local function fw_charged(p, r, cost)
    if cost == 0 then return r end
    return fw_settle(p, r.st, fw_held(p, fw_forgiven(p, r)) + cost, math.huge)
  end

  local function fw_stored(p, r)
    return { ws = fw_boundary(p, r.st, r.ah), rem = p.cap - r.sp }
  end

  -- Windows from `r.st` until the balance reaches `units`.
  local function fw_windows(p, r, units)
    local missing = units - p.cap + fw_held(p, r)
    if missing <= 0 then return 0 end
    return cdiv(missing, p.limit)
  end

  -- Until the balance reaches `units` (negative: a debt of that many); a window after an
  -- over-counted one reads it as full.
  local function fw_wait_for(p, r, now, units)
    local k = fw_windows(p, r, units)
    if k == 0 then return 0 end
    if k > r.ah and r.sp > p.cap then k = max(fw_windows(p, fw_forgiven(p, r), units), r.ah + 1) end
    return pos(fw_boundary(p, r.st, k) - now)
  end

  -- `wait_to_reserve`: when a reservation past its bound would be accepted.
  local function fw_wait_to_reserve(p, r, now, cost)
    local fits = math.huge
    if cost <= p.cap then fits = now + fw_wait_for(p, r, now, cost) end
    local reads = r
    if cost > 0 then reads = fw_forgiven(p, r) end
    local units_ok = now + fw_wait_for(p, reads, now, cost - p.owed)
    local full = now + fw_wait_for(p, reads, now, p.cap)
    local slot = now + fw_wait_for(p, reads, now, cost)
    local accepted = max(units_ok, slot - p.max_wait)
    if accepted >= full then
      -- From a full window the slot is `m` windows after the current one's start; windows of
      -- different lengths (months) may need a few tries.
      local m = cdiv(pos(cost - p.cap), p.limit)
      local t = max(units_ok, full)
      local start = fw_boundary(p, reads.st, fw_between(p, reads.st, t))
      accepted = math.huge
      for _ = 1, 24 do
        local next = fw_boundary(p, start, 1)
        local at = max(t, fw_boundary(p, start, m) - p.max_wait)
        if at < next then
          accepted = at
          break
        end
        start, t = next, next
      end
    end
    return pos(min(accepted, fits) - now)
  end

  function fixed.eval(p, s, now, cost, mode)
    local r = fw_roll(p, s, now)
    local after = fw_charged(p, r, cost)
    local kind, wait, left = 0, 0, r
    if p.cap - fw_held(p, r) >= cost then
      left = after
    elseif mode == 2 then
      wait = fw_wait_for(p, after, now, 0)
      -- Within its bounds, and reaching at most 2^51 µs ahead (`params::MAX_AFTER`), so that
      -- now + wait stays exact.
      if fw_held(p, after) - p.cap <= p.owed and wait <= p.max_wait
        and wait <= 2251799813685248 then
        kind, left = 1, after
      else
        kind, wait = 2, fw_wait_to_reserve(p, r, now, cost)
      end
    else
      kind, wait = 2, fw_wait_for(p, r, now, cost)
    end
    local bal = p.cap - fw_held(p, left)
    local remaining = pos(bal)
    local reset = 0
    if bal < p.cap then reset = fw_wait_for(p, left, now, remaining + 1) end
    return kind, wait, p.cap, remaining, reset, bal, fw_wait_for(p, left, now, p.cap)
  end

  function fixed.commit(p, s, now, cost)
    return fw_stored(p, fw_charged(p, fw_roll(p, s, now), cost))
  end

  -- From the last window a reservation holds first (`FixedWindow::refund`).
  function fixed.refund(p, s, now, units)
    local r = fw_roll(p, s, now)
    return fw_stored(p, fw_settle(p, r.st, fw_held(p, r) - units, r.ah))
  end

  function fixed.expires(p, s)
    return s.ws + fw_wait_for(p, fw_roll(p, s, s.ws), s.ws, p.cap)
  end

  -- The key is a hash (see fast_fixed.lua): its newest window's field, read as the units left.
  function fixed.load(p)
    local all = redis.pcall('HGETALL', p.key)
    if all.err then
      p.missing = false -- another type of value: a new key
      return nil
    end
    p.missing = #all == 0
    local s
    for i = 1, #all, 2 do
      local f = all[i]
      if #f == 9 then
        local tag, ws = struct.unpack('<Bd', f)
        if tag == 87 and (s == nil or ws > s.ws) then s = { ws = ws, rem = p.cap - all[i + 1] } end
      end
    end
    return s
  end

  function fixed.save(p, s, px)
    redis.call('DEL', p.key)
    redis.call('HSET', p.key, struct.pack('<Bd', 87, s.ws), p.cap - s.rem)
    redis.call('PEXPIRE', p.key, px)
  end

  -- A state as a string, to compare (see the undo).
  function fixed.encode(s)
    return struct.pack('<dd', s.ws, s.rem)
  end

  -- Takes back a charge: the state it found, when nothing changed the key since (exactly: the
  -- charge may have rolled the key into a later window, paying a debt back at the limit it
  -- brought, and a later call under another limit would pay at its own), or else the units
  -- given back.
  function fixed.undo(p, s, now, units, aux, at, ws, rem)
    local before = { ws = ws, rem = rem }
    if fixed.encode(s) == fixed.encode(fixed.commit(p, before, at, units)) then return before end
    return fixed.refund(p, s, now, units)
  end

  return fixed
end
