-- The time, the general scripts' first two numbers: now in microseconds since the Unix epoch, or
-- -1 to read the server's `TIME`; then the milliseconds added to every expiry (0 unless a test
-- clock injects the time).
local now, grace = struct.unpack('<dd', packed)
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
