-- tollgate: one atomic step of the Redis store (src/store/redis/mod.rs). Each script is put
-- together from the parts in src/store/redis/lua/ (mod.rs there lists which); this part opens
-- every one of them.
--
-- The same math as src/algorithm/*.rs, kept equal by the differential tests
-- (tests/redis_store/single.rs and cluster.rs).
-- Lua numbers are doubles: every integer below 2^53 is exact, and so is every sum, difference and
-- product whose result stays below 2^53 (IEEE arithmetic is correctly rounded). The Rust side
-- rejects rule parameters whose intermediates could pass 2^53 (`params::validate`), and divisions
-- go through `div`, which corrects the float quotient to the exact floor.
--
-- ARGV[1]  every number of the call as little-endian doubles (exact for integers below 2^53): one
--          string is cheaper for Redis to pass than many arguments, and one `struct.unpack` reads
--          it for less than one `tonumber` costs. Each script says which numbers it reads.
-- ARGV[2]  (the windows' fast paths) the cost in decimal: a number a script passes to a Redis
--          command is formatted by Redis with `%.17g`, which costs more than sending its text.
--
-- Redis runs the whole script from the top on every call, and every function, table or string
-- it creates there costs time. The common case (the fast paths: one charge of one key) is
-- therefore a script of its own that creates almost nothing, and the general scripts define an
-- algorithm's functions only when a call needs them.

local packed = ARGV[1]
-- Globals read once: each later use is then a register, not a lookup in the globals' table.
local redis, struct = redis, struct
