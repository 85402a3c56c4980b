-- Block (`Store::set_block`, behind `Limiter::block`): KEYS[1], a rule's block key, is blocked
-- for the call's third number (µs) from now; the key keeps its offences, forgotten the fourth
-- number (the penalty's forget_after) after the block ends. Reply: the time used, as one
-- little-endian double.
local d, forget = struct.unpack('<dd', packed, 17)
local _, offences = get_block(KEYS[1])
set_block(KEYS[1], now + d, offences or 0, forget)
return struct.pack('<d', now)
