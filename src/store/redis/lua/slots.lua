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
