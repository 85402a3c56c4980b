-- Fixed window (src/algorithm/fixed_window.rs): { ws = window start, rem = units left under this
-- call's capacity, negative while reservations are owed }. The key keeps the units spent
-- (`FixedWindowState::spent`), read as `rem = cap − spent` under whatever limit the call brings
-- (DESIGN §13: a window's count compared with the limit in force).
-- `p.owed` and `p.max_wait` bound a reservation (see `params::push`).

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

  local function fw_roll(p, s, now)
    local windows = fw_between(p, s.ws, now)
    local rem
    if s.rem >= p.cap then
      rem = p.cap
    elseif windows >= cdiv(p.cap - s.rem, p.limit) then
      rem = p.cap
    else
      rem = s.rem + windows * p.limit
    end
    return { ws = fw_boundary(p, s.ws, windows), rem = rem }
  end

  -- Until the balance reaches `units` (negative: a debt of that many).
  local function fw_wait_for(p, s, now, units)
    if s.rem >= units then return 0 end
    local windows = cdiv(units - s.rem, p.limit)
    return pos(fw_boundary(p, s.ws, windows) - now)
  end

  -- `wait_to_reserve`: when a reservation past its bound would be accepted.
  local function fw_wait_to_reserve(p, r, now, cost)
    local fits = math.huge
    if cost <= p.cap then fits = now + fw_wait_for(p, r, now, cost) end
    local units_ok = now + fw_wait_for(p, r, now, cost - p.owed)
    local full = now + fw_wait_for(p, r, now, p.cap)
    local slot = now + fw_wait_for(p, r, now, cost)
    local accepted = max(units_ok, slot - p.max_wait)
    if accepted >= full then
      -- From a full window the slot is `m` windows after the current one's start; windows of
      -- different lengths (months) may need a few tries.
      local m = cdiv(pos(cost - p.cap), p.limit)
      local t = max(units_ok, full)
      local start = fw_boundary(p, r.ws, fw_between(p, r.ws, t))
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
    local kind, wait, left = 0, 0, r
    local after = { ws = r.ws, rem = r.rem - cost }
    if after.rem >= 0 then
      left = after
    elseif mode == 2 then
      wait = fw_wait_for(p, after, now, 0)
      if -after.rem <= p.owed and wait <= p.max_wait then
        kind, left = 1, after
      else
        kind, wait = 2, fw_wait_to_reserve(p, r, now, cost)
      end
    else
      kind, wait = 2, fw_wait_for(p, r, now, cost)
    end
    local remaining = pos(left.rem)
    local reset = 0
    if left.rem < p.cap then reset = fw_wait_for(p, left, now, remaining + 1) end
    return kind, wait, p.cap, remaining, reset, left.rem, fw_wait_for(p, left, now, p.cap)
  end

  function fixed.commit(p, s, now, cost)
    local r = fw_roll(p, s, now)
    return { ws = r.ws, rem = r.rem - cost }
  end

  function fixed.refund(p, s, now, units)
    local r = fw_roll(p, s, now)
    return { ws = r.ws, rem = min(r.rem + units, p.cap) }
  end

  function fixed.expires(p, s)
    return fw_boundary(p, s.ws, cdiv(pos(p.cap - s.rem), p.limit))
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
