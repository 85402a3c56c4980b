-- Token bucket, on the server's time (`TIME`): the call carries the bucket's three numbers alone
-- (see fast_bucket.lua), and the expiry gets no grace.
local init, cost_span, span = struct.unpack('<ddd', packed)
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2] -- Lua converts the strings (cheaper than calling tonumber)
-- Rounds the expiry (µs) up to whole ms.
local round = 999
