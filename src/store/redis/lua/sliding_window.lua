-- Sliding window counter (src/algorithm/sliding_window.rs): { ws = window start, cur = current
-- count, prev = previous count }.

local function make_sliding()
  local sliding = {}

  function sliding.fresh(p, now)
    return { ws = window_containing(now, p.offset, p.period), cur = 0, prev = 0 }
  end

  -- `SlidingWindow::roll`: a window that has ended weighs at most the limit in force (a count
  -- above a lowered limit is forgiven when its window ends).
  local function sw_roll(p, s, now)
    local windows = div(pos(now - s.ws), p.period)
    local ws = s.ws + windows * p.period
    if windows == 0 then return { ws = s.ws, cur = s.cur, prev = min(s.prev, p.limit) } end
    if windows == 1 then return { ws = ws, cur = 0, prev = min(s.cur, p.limit) } end
    return { ws = ws, cur = 0, prev = 0 }
  end

  -- The part of the previous window still inside the sliding period, in µs.
  local function sw_left(p, s, now)
    return p.period - pos(now - s.ws)
  end

  -- prev·left + (cur + units)·period <= limit·period, without forming the sums.
  local function sw_fits(p, s, now, units)
    local room = p.limit - s.cur - units
    if room < 0 then return false end
    return s.prev * sw_left(p, s, now) <= room * p.period
  end

  local function sw_wait_for(p, s, now, units)
    if sw_fits(p, s, now, units) then return 0 end
    local P = p.period
    if s.prev > 0 then
      local room = p.limit - (s.cur + units)
      if room >= 0 then
        local keep = min(div(room * P, s.prev), P)
        local at = s.ws + (P - keep)
        if at < s.ws + P then return at - now end
      end
    end
    -- The current count weighs at most the limit once its window has ended (`sw_roll`).
    local into, cur = 0, min(s.cur, p.limit)
    if cur > 0 then into = P - min(div((p.limit - units) * P, cur), P) end
    return s.ws + P + into - now
  end

  -- floor((limit·P − prev·left − cur·P) / P), or 0.
  local function sw_remaining(p, s, now)
    return pos(p.limit - s.cur - cdiv(s.prev * sw_left(p, s, now), p.period))
  end

  function sliding.eval(p, s, now, cost, mode)
    local r = sw_roll(p, s, now)
    local kind, wait, left = 0, 0, r
    if sw_fits(p, r, now, cost) then
      left = { ws = r.ws, cur = r.cur + cost, prev = r.prev }
    else
      kind, wait = 2, sw_wait_for(p, r, now, cost)
    end
    local remaining = sw_remaining(p, left, now)
    local reset = 0
    if remaining < p.limit then reset = sw_wait_for(p, left, now, remaining + 1) end
    return kind, wait, p.limit, remaining, reset, remaining, sw_wait_for(p, left, now, p.limit)
  end

  function sliding.commit(p, s, now, cost)
    local r = sw_roll(p, s, now)
    return { ws = r.ws, cur = r.cur + cost, prev = r.prev }
  end

  function sliding.refund(p, s, now, units)
    local r = sw_roll(p, s, now)
    local from_current = min(units, r.cur)
    return { ws = r.ws, cur = r.cur - from_current, prev = pos(r.prev - (units - from_current)) }
  end

  function sliding.expires(p, s)
    local windows = 0
    if s.cur > 0 then windows = 2 elseif s.prev > 0 then windows = 1 end
    return s.ws + windows * p.period
  end

  -- The key is a hash (see fast_sliding.lua): its newest window, packed ('P': the current count
  -- and the previous one times 2^27) or not ('S': the current count, and 'p').
  local SHIFT = 134217728
  function sliding.load(p)
    local all = redis.pcall('HGETALL', p.key)
    if all.err then
      p.missing = false -- another type of value: a new key
      return nil
    end
    p.missing = #all == 0
    local ws, text, packed, prev
    for i = 1, #all, 2 do
      local f = all[i]
      if f == 'p' then
        prev = all[i + 1] + 0
      elseif #f == 9 then
        local tag, fws = struct.unpack('<Bd', f)
        if (tag == 83 or tag == 80) and (ws == nil or fws > ws) then
          ws, text, packed = fws, all[i + 1], tag == 80
        end
      end
    end
    if ws == nil then return nil end
    local cur = text + 0
    if packed then
      local n = cur
      cur = n % SHIFT
      prev = (n - cur) / SHIFT
    elseif prev == nil then
      return nil
    end
    -- A current count above the limit (a request brought a lower one since) is kept and
    -- compared with the limit in force (a limit that changes keeps the key's count), as the
    -- Rust keeps it; only past 2^53 / period (a count made under a shorter period) is it held
    -- there, so that the products stay exact. (A previous count weighs at most the limit:
    -- `sw_roll`.)
    local most = p.limit
    if cur > most or prev > most then most = math.floor(9007199254740991 / p.period) end
    return { ws = ws, cur = min(cur, most), prev = min(prev, most) }
  end

  -- Packed when the fast path packs (a limit below 2^26) and both counts fit.
  function sliding.save(p, s, px)
    redis.call('DEL', p.key)
    if p.limit < 67108864 and s.cur < 67108864 and s.prev < 67108864 then
      redis.call('HSET', p.key, struct.pack('<Bd', 80, s.ws), s.cur + s.prev * SHIFT)
    else
      redis.call('HSET', p.key, struct.pack('<Bd', 83, s.ws), s.cur, 'p', s.prev)
    end
    redis.call('PEXPIRE', p.key, px)
  end

  -- A state as a string, to compare (see the undo).
  function sliding.encode(s)
    return struct.pack('<ddd', s.ws, s.cur, s.prev)
  end

  sliding.undo = sliding.refund

  return sliding
end
