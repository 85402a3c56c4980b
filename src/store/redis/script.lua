-- tollgate: one atomic step of the Redis store (src/store/redis/mod.rs).
--
-- The same math as src/algorithm/*.rs, kept equal by the differential tests in tests/redis_store/single.rs.
-- Lua numbers are doubles: every integer below 2^53 is exact, and so is every sum, difference and
-- product whose result stays below 2^53 (IEEE arithmetic is correctly rounded). The Rust side
-- rejects rule parameters whose intermediates could pass 2^53 (`params::validate`), and divisions
-- go through `div`, which corrects the float quotient to the exact floor.
--
-- ARGV[1]  every number of the call as little-endian doubles (exact for integers below 2^53): one
--          string is cheaper for Redis to pass than many arguments, and one `struct.unpack` reads
--          it for less than one `tonumber` costs. A fast path's call (below) has 3, 5, 6 or 7
--          numbers; the general code's, at least 17 (zeros pad the end):
--            op: 1 applies the batch (all or nothing); 2 checks it (nothing charged; admitted
--              records report what they have left; a record its own rule denies still offends
--              under a penalty, as in op 1); 3 refunds each record; 4 undoes each
--              record's earlier charge exactly (a cross-slot batch that was denied in another
--              slot); 5 blocks KEYS[1] (a block key) for the fifth number (µs), its offences
--              forgotten the sixth number after the block (see "Blocks" below);
--            now in microseconds since the Unix epoch, or -1 to read the server's TIME;
--            milliseconds added to every expiry (0 unless a test clock injects the time);
--            the number of records, then for each record: n (1, or 2 for a sharded rule's two
--              candidate shards), mode (0 charge, 1 check, 2 reserve), cost, aux (undo: the
--              units a burst pool took from its steady bucket; apply and check: how many
--              penalty numbers follow the candidates, 0 for a rule without a penalty), at
--              (undo: the time of the charge), created (undo: 1 when the charge found no key,
--              which it then created), two numbers (undo: the state the charge found, as its
--              reply gave it), then n times: algorithm code and parameters (see `read`), then
--              the penalty's numbers: forget_after, then the block durations in order of
--              offence (µs).
-- KEYS     one per candidate, in order, each record's block key after its candidates (apply
--          and check, rules with a penalty).
-- Reply    (the general code's; each fast path says its own) one string of little-endian
--          doubles, like ARGV[1] (cheaper to build and to read than an array reply): twelve
--          integers per record: verdict (0 allowed, 1 reserved, 2 denied,
--          3 denied by an offence that blocked the key), wait or retry-after (µs), limit,
--          remaining, time to the next unit (µs), chosen candidate (0 or 1), aux (the units a
--          burst pool charge took from its steady bucket), the signed balance, time until full
--          (µs), missing (op 1: 1 when the chosen key held no state before the call, so that an
--          undo of the charge removes the key again; ops 2 to 4: 1 when it holds none after the
--          call, so that the answer does not move with the clock), and for a token bucket's or
--          burst pool's charge (op 1) the state it found (a bucket's, 0; a pool's two), which an
--          undo restores when nothing changed the key since; then the time used.
--
-- Redis runs the whole script from the top on every call, and every function, table or string
-- it creates there costs time. The common case (the fast paths below) therefore comes first and
-- creates almost nothing; the general code is only defined when a call needs it.

local packed = ARGV[1]
local size = #packed
-- Globals read once: each later use is then a register, not a lookup in the globals' table.
local redis, struct = redis, struct

------------------------------------------------------------------------------------------------
-- Fast paths: one charge (mode 0) of one key under one rule without a penalty, for a token
-- bucket, a sliding window or a fixed window with a period in µs and no roll-over: what nearly
-- every request is. The Rust side chooses them (src/store/redis/fast.rs) and sends only the
-- numbers they need; the call's length says which. The script decides and commits; it answers
-- only the state it decided on (rolled to now, before the charge), from which the Rust side
-- builds the outcome with the memory store's own functions. Each is the same math as the general
-- code below (the functions named in it), without a function or a table made per call: a
-- bucket's state is a tag byte and a binary double, a window's count grows in place in a hash,
-- and divisions by a rule's period use `%`, exact below 2^53 for these operands (the float
-- quotient inside it cannot round up to the next integer while the dividend is below 2^53).

-- Token bucket (`make_bucket`): the initial balance's span (initial × interval: a new key was
-- empty that long ago), the cost's span (cost × interval, at least 1: a charge of 0 goes to the
-- general code) and the capacity's span (the most debt after a charge), on the server's time
-- (`TIME`) when the call has these three numbers alone; on a time the caller sends (a test
-- clock), that time and the grace (ms) added to the expiry come first. State: 'E', the moment the
-- bucket was empty (µs, signed). Reply (an integer): the debt before the charge × 4, + 2 when
-- denied, + 1 when the key was missing.
-- The two blocks below are the same lines but for where `now` comes from and the grace (a unit
-- test in fast.rs keeps them so): one block for both costs the server's time ~450 instructions
-- a call (locals declared ahead, moves), and the tests on a test clock check the math of both.
if size == 24 then
  local init, cost_span, span = struct.unpack('<ddd', packed)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2] -- Lua converts the strings (cheaper than calling tonumber)
  local key = KEYS[1]
  local raw = redis.pcall('GET', key) -- an error (another type of value) reads as a new key
  local flags, tag, e = 0
  if not raw then flags = 1 elseif #raw == 9 then tag, e = struct.unpack('<Bd', raw) end
  -- 'E': otherwise new, another algorithm's state, or an earlier version's ('T', its tat)
  if tag ~= 69 then e = now - init end
  local debt = e + span - now
  if debt < 0 then debt, e = 0, now - span end
  local after = debt + cost_span
  if after > span then return debt * 4 + 2 + flags end
  -- The key expires when the bucket is full again: after ≥ 1 µs, rounded up to whole ms (≥ 1).
  -- `%d` truncates the quotient, whose float rounding cannot reach the next integer for spans
  -- below 2^53 µs. (`PSETEX` is `SET … PX` with less to parse.)
  redis.call('PSETEX', key, string.format('%d', (after + 999) / 1000),
    struct.pack('<Bd', 69, e + cost_span))
  return debt * 4 + flags
end

if size == 40 then
  local now, grace, init, cost_span, span = struct.unpack('<ddddd', packed)
  local key = KEYS[1]
  local raw = redis.pcall('GET', key) -- an error (another type of value) reads as a new key
  local flags, tag, e = 0
  if not raw then flags = 1 elseif #raw == 9 then tag, e = struct.unpack('<Bd', raw) end
  if tag ~= 69 then e = now - init end
  local debt = e + span - now
  if debt < 0 then debt, e = 0, now - span end
  local after = debt + cost_span
  if after > span then return debt * 4 + 2 + flags end
  redis.call('PSETEX', key, string.format('%d', (after + 999) / 1000 + grace),
    struct.pack('<Bd', 69, e + cost_span))
  return debt * 4 + flags
end

if size == 48 then
  -- Sliding window counter (`make_sliding`): now, grace, limit, period, offset, cost. The key
  -- is a hash: the current window's count under its start ('S' and a binary double), and the
  -- previous window's under 'p'. The count grows in place (`HINCRBY`), the key keeping the
  -- expiry the window's first charge gave it (two periods after the window's start, when both
  -- counts have left the sliding period).
  -- Reply: 2 when denied + 1 when the key was missing, now − window start, the two counts
  -- before the charge.
  local now, grace, limit, period, offset, cost = struct.unpack('<dddddd', packed)
  if now < 0 then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
  local key = KEYS[1]
  -- `window_containing` (windows at offset + k × period).
  local ws = now - (now + period - offset) % period
  if ws < 0 then ws = 0 end
  local field = struct.pack('<Bd', 83, ws)
  -- An error (a value of another algorithm or format) reads as a new key.
  local cur = redis.pcall('HINCRBY', key, field, cost)
  local counted = type(cur) == 'number'
  if counted and cur ~= cost then
    -- The key holds one window's count at a time (the newest): this window's, counted in place.
    local prev = redis.call('HGET', key, 'p')
    if prev then
      cur = cur - cost
      -- Counts never exceed the limit, unless it was lowered since: keep the products in bound.
      if cur > limit then cur = limit end
      prev = prev + 0
      if prev > limit then prev = limit end
      local into = now - ws
      local room = limit - cur - cost
      -- The previous window's part still inside the sliding period weighs prev × left / period.
      if room < 0 or prev * (period - into) > room * period then
        if cost > 0 then redis.call('HINCRBY', key, field, -cost) end
        return struct.pack('<dddd', 2, into, cur, prev)
      end
      return struct.pack('<dddd', 0, into, cur, prev)
    end
  end

  -- The window's first charge, a charge of 0, or a key this path cannot count in: the state is
  -- what the key held before this call (its newest window, rolled over to now: `sw_roll`), and
  -- the key is written whole, as the general code does.
  local flags, sws, prev, other = 0, ws, 0, false
  cur = 0
  if counted then
    local all = redis.call('HGETALL', key)
    local stored = false
    for i = 1, #all, 2 do
      local f = all[i]
      if f == 'p' then
        prev, stored = all[i + 1] + 0, true
      elseif f ~= field and #f == 9 then
        local tag, ows = struct.unpack('<Bd', f)
        if tag == 83 and (not other or ows > sws) then
          sws, cur, other = ows, all[i + 1] + 0, true
        end
      end
    end
    if not stored then
      -- Nothing this rule wrote: a new key (missing when this call created it).
      sws, cur, prev, other = ws, 0, 0, false
      if #all == 2 and all[2] + 0 == cost then flags = 1 end
    elseif not other then
      -- This window's count was stored (at zero) before this call.
      cur = 0
    end
    if cur > limit then cur = limit end
    if prev > limit then prev = limit end
    if now - sws >= period then
      local into = (now - sws) % period
      if now - sws - into == period then prev = cur else prev = 0 end
      sws, cur = now - into, 0
    end
  end
  local into = now - sws
  local left = period - into
  if left > period then left = period end
  local room = limit - cur - cost
  if room < 0 or prev * left > room * period then
    -- Denied: the key as it was.
    if counted then
      if other or sws ~= ws then
        redis.call('HDEL', key, field)
      elseif cost > 0 then
        redis.call('HINCRBY', key, field, -cost)
      end
      if flags == 1 then redis.call('DEL', key) end
    end
    return struct.pack('<dddd', 2 + flags, into, cur, prev)
  end
  -- The key expires when both counts have left the sliding period (never sooner than 1 ms).
  local expires = sws + 2 * period
  if cur + cost == 0 then
    expires = sws
    if prev > 0 then expires = sws + period end
  end
  local px = expires - now + 999
  px = (px - px % 1000) / 1000
  if px < 1 then px = 1 end
  redis.call('DEL', key)
  redis.call('HSET', key, struct.pack('<Bd', 83, sws), cur + cost, 'p', prev)
  redis.call('PEXPIRE', key, string.format('%d', px + grace))
  return struct.pack('<dddd', flags, into, cur, prev)
end

if size == 56 then
  -- Fixed window whose capacity is its limit (`make_fixed`): now, grace, rate, period, capacity,
  -- offset, cost. A fixed window's key is a hash: one field, the window's start ('W' and a
  -- binary double), holding the units used in that window (more than the capacity while reservations
  -- are owed). The window's count grows in place (`HINCRBY`): the key keeps the expiry its
  -- window's first charge gave it (the end of the window, when a key of a window's units is
  -- a new key's again), so a charge inside a window writes nothing else.
  -- Reply: 2 when denied + 1 when the key was missing, now − window start, the units left
  -- before the charge.
  local now, grace, rate, period, cap, offset, cost = struct.unpack('<ddddddd', packed)
  if now < 0 then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
  local key = KEYS[1]
  -- `window_containing` (windows at offset + k × period).
  local ws = now - (now + period - offset) % period
  if ws < 0 then ws = 0 end
  local field = struct.pack('<Bd', 87, ws)
  -- An error (a value of another algorithm or format) reads as a new key.
  local used = redis.pcall('HINCRBY', key, field, cost)
  local counted = type(used) == 'number'
  if counted and used ~= cost then
    if used > cap then
      -- Denied: nothing charged. (A cost of 0 changed nothing; "-0" is not an integer to Redis.)
      if cost > 0 then redis.call('HINCRBY', key, field, -cost) end
      return struct.pack('<ddd', 2, now - ws, cap - used + cost)
    end
    return struct.pack('<ddd', 0, now - ws, cap - used + cost)
  end

  -- The window's first charge, a charge of 0, or a key this path cannot count in: the state is
  -- what the key held before (`fw_roll` of its newest other window), and the key is written
  -- whole, as the general code does.
  local flags, sws, rem = 1, ws, cap
  if counted then
    local all = redis.call('HGETALL', key)
    for i = 1, #all, 2 do
      local f = all[i]
      if f ~= field and #f == 9 then
        local tag, ows = struct.unpack('<Bd', f)
        if tag == 87 and (flags == 1 or ows > sws) then
          flags, sws, rem = 0, ows, cap - all[i + 1]
        end
      end
    end
    if flags == 0 then
      -- `fw_roll` from the stored window to the one containing now.
      local windows = 0
      if now - sws >= period then
        local into = (now - sws) % period
        windows = (now - sws - into) / period
        sws = now - into
      end
      -- (A product past 2^53 is inexact, but then far above cap - rem: the comparison holds.)
      if rem >= cap or windows * rate >= cap - rem then
        rem = cap
      else
        rem = rem + windows * rate
      end
    end
  else
    flags = 0
  end
  if rem < cost then
    -- Denied: the key as it was. This call's field held nothing before it (or it would have
    -- been counted above): remove it again.
    if counted then redis.call('HDEL', key, field) end
    return struct.pack('<ddd', 2 + flags, now - sws, rem)
  end
  -- The key expires when the window that fills it again starts (never sooner than 1 ms).
  local owed = cap - rem + cost + rate - 1
  local px = sws + (owed - owed % rate) / rate * period - now + 999
  px = (px - px % 1000) / 1000
  if px < 1 then px = 1 end
  redis.call('DEL', key)
  redis.call('HSET', key, struct.pack('<Bd', 87, sws), cap - rem + cost)
  redis.call('PEXPIRE', key, string.format('%d', px + grace))
  return struct.pack('<ddd', flags, now - sws, rem)
end

------------------------------------------------------------------------------------------------
-- The general code: any number of records and candidates, every algorithm and operation.

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

local op, now, grace, count = struct.unpack('<dddd', packed)
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end

------------------------------------------------------------------------------------------------
-- Blocks (src/algorithm/penalty.rs): a rule with a penalty keeps, beside the counters, a key
-- 'until,offences'. While `until` is ahead, the rule denies the key without reading its
-- counters; a charge the rule denies otherwise is an offence and starts a block. The key
-- expires when its offences are forgotten (forget_after after `until`).

local function set_block(key, untl, offences, forget)
  local px = div(untl + forget - now + 999, 1000)
  if px < 1 then px = 1 end
  redis.call('SET', key, string.format('%d,%d', untl, offences), 'PX', string.format('%d', px + grace))
end

local function get_block(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  local untl, offences = string.match(raw, '^(%d+),(%d+)$')
  if untl == nil then return nil end
  return tonumber(untl), tonumber(offences)
end

if op == 5 then
  -- `Limiter::block`: n is the duration, mode the forget_after; offences are kept.
  local _, _, _, _, d, forget = struct.unpack('<dddddd', packed)
  local _, offences = get_block(KEYS[1])
  set_block(KEYS[1], now + d, offences or 0, forget)
  return struct.pack('<d', now)
end


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
-- a fixed window's and a sliding window's, a hash (see their fast paths); a sliding log's and a
-- burst pool's, a tag letter ('l', 'P') and decimal integers separated by commas. A value of
-- another algorithm, format or type reads as a new key.

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

------------------------------------------------------------------------------------------------
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

------------------------------------------------------------------------------------------------
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

-- Fixed window: { ws = window start, rem = units left, negative while reservations are owed }.
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

  -- The key is a hash (see the fast path): its newest window's field, read as the units left.
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

  fixed.undo = fixed.refund

  return fixed
end

------------------------------------------------------------------------------------------------
-- Sliding window counter: { ws = window start, cur = current count, prev = previous count }.

local function make_sliding()
  local sliding = {}

  function sliding.fresh(p, now)
    return { ws = window_containing(now, p.offset, p.period), cur = 0, prev = 0 }
  end

  local function sw_roll(p, s, now)
    local windows = div(pos(now - s.ws), p.period)
    local ws = s.ws + windows * p.period
    if windows == 0 then return s end
    if windows == 1 then return { ws = ws, cur = 0, prev = s.cur } end
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
    local into = 0
    if s.cur > 0 then into = P - min(div((p.limit - units) * P, s.cur), P) end
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

  -- The key is a hash (see the fast path): its newest window's count, and 'p'.
  function sliding.load(p)
    local all = redis.pcall('HGETALL', p.key)
    if all.err then
      p.missing = false -- another type of value: a new key
      return nil
    end
    p.missing = #all == 0
    local s, prev
    for i = 1, #all, 2 do
      local f = all[i]
      if f == 'p' then
        prev = all[i + 1] + 0
      elseif #f == 9 then
        local tag, ws = struct.unpack('<Bd', f)
        if tag == 83 and (s == nil or ws > s.ws) then s = { ws = ws, cur = all[i + 1] + 0 } end
      end
    end
    if s == nil or prev == nil then return nil end
    -- Counts never exceed the limit, unless the rule's limit was lowered since: keep the products
    -- within their bound then too.
    return { ws = s.ws, cur = min(s.cur, p.limit), prev = min(prev, p.limit) }
  end

  function sliding.save(p, s, px)
    redis.call('DEL', p.key)
    redis.call('HSET', p.key, struct.pack('<Bd', 83, s.ws), s.cur, 'p', s.prev)
    redis.call('PEXPIRE', p.key, px)
  end

  -- A state as a string, to compare (see the undo).
  function sliding.encode(s)
    return struct.pack('<ddd', s.ws, s.cur, s.prev)
  end

  sliding.undo = sliding.refund

  return sliding
end

------------------------------------------------------------------------------------------------
-- Sliding log: a flat list { at1, n1, at2, n2, ... }, oldest first.

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

------------------------------------------------------------------------------------------------
-- Burst pool: { s = steady bucket's state, p = pool's }; p.steady and p.pool are token buckets.

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

------------------------------------------------------------------------------------------------
-- Concurrency limit (src/algorithm/concurrency.rs), only run for a record of one: a sorted set
-- of leases, id -> expiry (µs, the server's time). A lease whose instance stopped renewing it
-- (src/store/redis/leases.rs) expires; expired leases are purged on every look, and the live ones
-- are the slots taken. The parameters: max, lease (µs), id (the lease this charge adds). The
-- state is the number of live leases; each call writes the set itself (`save` leaves it alone).

local function make_slots()
  local slots = {}

  function slots.fresh(p, now)
    return 0
  end

  function slots.load(p)
    redis.call('ZREMRANGEBYSCORE', p.key, '-inf', int(now))
    local n = redis.call('ZCARD', p.key)
    p.missing = n == 0
    return n
  end

  function slots.encode(s)
    return int(s)
  end

  function slots.eval(p, s, now, cost, mode)
    local free = pos(p.max - s)
    if cost <= free then
      return 0, 0, p.max, free - cost, 0, free - cost, 0
    end
    -- `SLOT_RETRY_AFTER`: no estimate of when a response ends beats one second.
    return 2, 1000000, p.max, free, 0, free, 0
  end

  function slots.commit(p, s, now, cost)
    if cost > 0 then
      redis.call('ZADD', p.key, int(now + p.lease), int(p.id))
      redis.call('PEXPIRE', p.key, int(cdiv(p.lease, 1000) + grace))
    end
    return s + cost, 0
  end

  function slots.refund(p, s, now, units)
    return pos(s - redis.call('ZREM', p.key, int(p.id)))
  end

  function slots.undo(p, s, now, cost, aux, at)
    return pos(s - redis.call('ZREM', p.key, int(p.id)))
  end

  return slots
end

------------------------------------------------------------------------------------------------
-- Each call defines only the algorithms its records use (a script runs from the top every time).
local MAKERS = { make_bucket, make_fixed, make_sliding, make_log, make_pool, make_slots }
local made = {}
local function algorithm(code)
  local alg = made[code]
  if alg == nil then
    alg = MAKERS[code]()
    made[code] = alg
  end
  return alg
end

------------------------------------------------------------------------------------------------
-- Driver.

-- Every number of the call, in order.
local argv = {}
for i = 1, #packed / 8 do argv[i] = struct.unpack('<d', packed, 8 * i - 7) end

-- Tables are built whole by constructors (growing them field by field rehashes them).
local keys = KEYS
local a, k = 5, 1

local function bucket_params(at)
  local T, cap = argv[at], argv[at + 1]
  return { T = T, cap = cap, init = argv[at + 2], span = cap * T }
end

-- The parameters of one candidate, from argv[a] on.
local function read()
  local code = argv[a]
  local alg, key = algorithm(code), keys[k]
  k = k + 1
  local p
  if code == 1 then
    local T, cap = argv[a + 1], argv[a + 2]
    p = {
      alg = alg, code = 1, key = key, T = T, cap = cap, init = argv[a + 3],
      span = cap * T, cost_span = argv[a + 4], max_after = argv[a + 5],
      max_wait = argv[a + 6], state = false,
    }
    a = a + 7
  elseif code == 2 then
    p = {
      alg = alg, code = 2, key = key, limit = argv[a + 1],
      period = argv[a + 2], cap = argv[a + 3],
      offset = argv[a + 4], owed = argv[a + 5], max_wait = argv[a + 6], state = false,
      off = argv[a + 4] - 86400000000, -- a calendar month's UTC offset (period 0)
    }
    a = a + 7
  elseif code == 3 then
    p = {
      alg = alg, code = 3, key = key, limit = argv[a + 1],
      period = argv[a + 2], offset = argv[a + 3], state = false,
    }
    a = a + 4
  elseif code == 4 then
    p = {
      alg = alg, code = 4, key = key, limit = argv[a + 1],
      period = argv[a + 2], state = false,
    }
    a = a + 3
  elseif code == 6 then
    p = {
      alg = alg, code = 6, key = key, max = argv[a + 1], lease = argv[a + 2], id = argv[a + 3],
      state = false,
    }
    a = a + 4
  else
    p = {
      alg = alg, code = 5, key = key, steady = bucket_params(a + 1),
      pool = bucket_params(a + 4), state = false,
    }
    a = a + 7
  end
  return p
end

local records = {}
for r = 1, count do
  local n = argv[a]
  local rec = {
    n = n, mode = argv[a + 1], cost = argv[a + 2],
    aux = argv[a + 3], at = argv[a + 4], created = argv[a + 5], b1 = argv[a + 6],
    b2 = argv[a + 7], c = {}, res = false, chosen = 1, aux_out = 0, found = false,
  }
  a = a + 8
  for j = 1, n do rec.c[j] = read() end
  if (op == 1 or op == 2) and rec.aux > 0 then
    local ds = {}
    for i = 1, rec.aux - 1 do ds[i] = argv[a + i] end
    rec.pen = { key = keys[k], forget = argv[a], ds = ds }
    k = k + 1
    a = a + rec.aux
  end
  records[r] = rec
end

-- The candidate's state, or nil when the key is missing or holds another algorithm's state.
local function load(p)
  if p.alg.load then return p.alg.load(p) end
  local raw = redis.pcall('GET', p.key) -- an error (another type of value) reads as a new key
  p.missing = not raw
  if type(raw) == 'string' then return p.alg.decode(p, raw) end
  return nil
end

local function state_of(p)
  local s = load(p)
  if s == nil then s = p.alg.fresh(p, now) end
  return s
end

-- The key expires when its state equals a fresh key's (never sooner than 1 ms).
local function save(p, s)
  if p.code == 6 then return end
  local ttl = p.alg.expires(p, s) - now
  local px = 1
  if ttl > 0 then px = cdiv(ttl, 1000) end
  if p.alg.save then
    p.alg.save(p, s, int(px + grace))
  else
    redis.call('SET', p.key, p.alg.encode(s), 'PX', int(px + grace))
  end
end

local reply = {}
local function answer(rec, res)
  -- A blocked key's answer moves with the clock (the block ends) even when its counter is gone.
  local created = 0
  if rec.c[rec.chosen].missing and not rec.blocked then created = 1 end
  -- The state a bucket's or pool's charge found, for an exact undo.
  local b1, b2, found = 0, 0, rec.found
  if type(found) == 'table' then b1, b2 = found.s, found.p elseif found then b1 = found end
  reply[#reply + 1] = struct.pack(
    '<dddddddddddd', res[1], res[2], res[3], res[4], res[5], rec.chosen - 1, rec.aux_out or 0,
    res[6], res[7], created, b1, b2
  )
end

if op == 1 or op == 2 then
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
  for _, rec in ipairs(records) do
    local p = rec.c[rec.chosen]
    local pen = rec.pen
    if all and op == 1 then
      if rec.mode ~= 1 then
        local s, aux = p.alg.commit(p, p.state, now, rec.cost)
        rec.aux_out = aux
        if p.code == 1 or p.code == 5 then rec.found = p.state end
        save(p, s)
      end
    elseif rec.res[1] ~= 2 then
      -- All or nothing: report what the admitted charge leaves, uncharged.
      local res = { p.alg.eval(p, p.state, now, 0, 1) }
      res[1], res[2] = 0, 0
      rec.res = res
    elseif pen and not rec.blocked and rec.mode ~= 1 and rec.cost > 0 then
      -- An offence: `Penalty::offend`, then `Penalty::punish`. (Also in op 2: a cross-slot
      -- batch checks its later slots after a denial, and a rule denied there offends as it
      -- would in one step.)
      local offences = 1
      if pen.untl and now < pen.untl + pen.forget then offences = pen.offences + 1 end
      local untl = now + pen.ds[min(offences, #pen.ds)]
      set_block(pen.key, untl, offences, pen.forget)
      local left = untl - now
      local res = rec.res
      rec.res = { 3, max(res[2], left), res[3], 0, max(res[5], left), res[6], max(res[7], left) }
    end
    answer(rec, rec.res)
  end
elseif op == 3 or op == 4 then
  for _, rec in ipairs(records) do
    -- A sharded refund goes to the candidate with fewer units left.
    rec.chosen = 1
    for j, p in ipairs(rec.c) do
      p.stored = load(p)
      p.state = p.stored or p.alg.fresh(p, now)
      local _, _, _, remaining = p.alg.eval(p, p.state, now, 0, 1)
      p.remaining = remaining
      if remaining < rec.c[rec.chosen].remaining then rec.chosen = j end
    end
    local p = rec.c[rec.chosen]
    if op == 3 then
      -- A token bucket that is not stored is full: nothing to give back.
      if p.stored ~= nil or p.code ~= 1 then
        p.state = p.alg.refund(p, p.state, now, rec.cost)
        save(p, p.state)
        p.missing = false
      end
    elseif rec.mode ~= 1 and p.stored ~= nil then
      -- A check wrote nothing; anything else is taken back, to the key's state before the
      -- charge. A key the charge created (there was none before), and that nothing else touched
      -- since, is removed again: a missing key is not the same as a stored fresh state, since a
      -- new key's state depends on when it is first seen (an initial balance below the
      -- capacity). A key that existed before keeps its undone state, even one equal to a fresh
      -- key's at that instant: a refund or a charge of 0 may have created it earlier at that instant,
      -- and from then on it refills.
      p.state = p.alg.undo(p, p.state, now, rec.cost, rec.aux, rec.at, rec.b1, rec.b2)
      local encoded = p.alg.encode(p.state)
      if rec.created == 1 and encoded == p.alg.encode(p.alg.fresh(p, rec.at)) then
        redis.call('DEL', p.key)
        p.missing = true
      else
        save(p, p.state)
        p.missing = false
      end
    end
    local res = { p.alg.eval(p, p.state, now, 0, 1) }
    res[1], res[2] = 0, 0
    answer(rec, res)
  end
else
  return redis.error_reply('tollgate: unknown op')
end
reply[#reply + 1] = struct.pack('<d', now)
return table.concat(reply)
