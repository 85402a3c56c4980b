-- Lease renewal (src/store/redis/leases.rs): renews this instance's leases on one key, KEYS[1],
-- a concurrency rule's sorted set (see slots.lua). ARGV: now (µs, or -1 for the server's
-- `TIME`), the lease's length (µs), the key's expiry (ms), then the lease ids. Each id still in
-- the set gets the expiry now + the lease. A lease already purged stays gone (its slot may have
-- been taken since); one expired but not yet purged is renewed, since nobody has counted its
-- slot as free. Reply: how many leases were renewed.
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local expiry = string.format('%d', now + tonumber(ARGV[2]))
local renewed = 0
for i = 4, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i])
end
if renewed > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return renewed
