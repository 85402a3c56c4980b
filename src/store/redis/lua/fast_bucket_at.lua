-- Token bucket, on a time the caller sends (a test clock): that time and the grace (ms) added to
-- the expiry come before the bucket's three numbers (see fast_bucket.lua).
local now, grace, init, cost_span, span = struct.unpack('<ddddd', packed)
-- Rounds the expiry (µs) up to whole ms, and adds the grace.
local round = 999 + grace * 1000
