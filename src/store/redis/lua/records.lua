-- The records of a charge, check, refund or undo: their numbers read, each candidate's
-- algorithm, parameters and state, the key written back, and the reply.
--
-- ARGV[1]  after the time (time.lua): the number of records, then for each record: n (1, or 2
--          for a sharded rule's two candidate shards), mode (0 charge, 1 check, 2 reserve), cost,
--          aux (undo: the units a burst pool took from its steady bucket; charge and check: how
--          many penalty numbers follow the candidates, 0 for a rule without a penalty), at
--          (undo: the time of the charge; charge and check: 1 for a rule with overrides, else 0),
--          created (undo: 1 when the charge found no key, which it then created), two numbers
--          (undo: the state the charge found, as its reply gave it), then n times: algorithm
--          code and parameters (see `read`), then (charge and check) the penalty's numbers:
--          forget_after, then the block durations in order of offence (µs).
-- KEYS     one per candidate, in order, each record's block key after its candidates (charge
--          and check, rules with a penalty), then its override key (charge and check, rules with
--          overrides).
-- Reply    one string of little-endian doubles, like ARGV[1] (cheaper to build and to read than
--          an array reply): twelve integers per record (see `answer`), then the time used; then,
--          when a record of an overridable rule was decided, the overrides' part (overrides.lua).

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

-- Every number of the call, in order.
local argv = {}
for i = 1, #packed / 8 do argv[i] = struct.unpack('<d', packed, 8 * i - 7) end

-- Tables are built whole by constructors (growing them field by field rehashes them).
local keys = KEYS
local count = argv[3]
local a, k = 4, 1

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

-- The next record: its head and its candidates, from argv[a] on (a penalty's numbers, which
-- follow, are the caller's to read).
local function read_record()
  local n = argv[a]
  local rec = {
    n = n, mode = argv[a + 1], cost = argv[a + 2],
    aux = argv[a + 3], at = argv[a + 4], created = argv[a + 5], b1 = argv[a + 6],
    b2 = argv[a + 7], c = {}, res = false, chosen = 1, aux_out = 0, found = false,
  }
  a = a + 8
  for j = 1, n do rec.c[j] = read() end
  return rec
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

-- What a candidate's state leaves, answered as admitted with nothing charged.
local function uncharged(p)
  local res = { p.alg.eval(p, p.state, now, 0, 1) }
  res[1], res[2] = 0, 0
  return res
end

-- A record's twelve integers: verdict (0 allowed, 1 reserved, 2 denied, 3 denied by an offence
-- that blocked the key), wait or retry-after (µs), limit, remaining, time to the next unit (µs),
-- chosen candidate (0 or 1), aux (the units a burst pool charge took from its steady bucket),
-- the signed balance, time until full (µs), missing (charge: 1 when the chosen key held no state
-- before the call, so that an undo of the charge removes the key again; check, refund and undo:
-- 1 when it holds none after the call, so that the answer does not move with the clock), and for
-- a token bucket's, burst pool's or fixed window's charge the state it found (a bucket's, 0; a
-- pool's two; a window's start and units left), which an undo restores when nothing changed the
-- key since.
local reply = {}
local function answer(rec, res)
  -- A blocked key's answer moves with the clock (the block ends) even when its counter is gone.
  local created = 0
  if rec.c[rec.chosen].missing and not rec.blocked then created = 1 end
  -- The state a bucket's, pool's or window's charge found, for an exact undo.
  local b1, b2, found = 0, 0, rec.found
  if type(found) == 'table' then
    if found.ws then b1, b2 = found.ws, found.rem else b1, b2 = found.s, found.p end
  elseif found then
    b1 = found
  end
  reply[#reply + 1] = struct.pack(
    '<dddddddddddd', res[1], res[2], res[3], res[4], res[5], rec.chosen - 1, rec.aux_out or 0,
    res[6], res[7], created, b1, b2
  )
end

-- The overrides' part of the reply (overrides.lua), when a record reads one.
local tail = false

-- The reply: every record's answer, then the time used (and the overrides' part).
local function finish()
  reply[#reply + 1] = struct.pack('<d', now)
  if tail then reply[#reply + 1] = table.concat(tail) end
  return table.concat(reply)
end
