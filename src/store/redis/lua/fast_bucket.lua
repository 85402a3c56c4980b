-- Token bucket (`make_bucket`), after its opening part (fast_bucket_now.lua or
-- fast_bucket_at.lua) has read `now`, `round` and the bucket's numbers: the initial balance's
-- span (initial × interval: a new key was empty that long ago), the cost's span (cost ×
-- interval, at least 1: a charge of 0 goes to the general scripts) and the capacity's span (the
-- most debt after a charge). State: 'E', the moment the bucket was empty (µs, signed). Reply (an
-- integer): the debt before the charge × 4, + 2 when denied, + 1 when the key was missing.
-- The two bucket scripts share this part and differ only in their opening: one script choosing
-- where `now` comes from at run time costs the server's time ~450 instructions a call (locals
-- declared ahead, moves), and the tests on a test clock check the math of both.
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
redis.call('PSETEX', key, string.format('%d', (after + round) / 1000),
  struct.pack('<Bd', 69, e + cost_span))
return debt * 4 + flags
