-- Override (`Store::set_override`, behind `Limiter::set_override`): KEYS[1], a key's override
-- key, holds `until` (now plus the call's third number, the TTL in µs) as one little-endian
-- double, then ARGV[2] (overrides.rs); it expires with the TTL, plus a test clock's slack.
-- Reply: the time used, as one little-endian double.
local ttl = struct.unpack('<d', packed, 17)
local px = string.format('%d', div(ttl + 999, 1000) + grace)
redis.call('SET', KEYS[1], struct.pack('<d', now + ttl) .. ARGV[2], 'PX', px)
return struct.pack('<d', now)
