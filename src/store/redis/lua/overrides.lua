-- Per-key overrides (src/store/redis/overrides.rs), for the charge and the check: a record of an
-- overridable rule (deciding, its head's fifth number is 1) has one more key after its candidate
-- and block keys, its override key. While that key holds an override whose `until` is ahead and
-- whose limit can take the record's cost (a reservation, always), the override's numbers replace
-- the candidate's: the counters stay the same key, read under the new numbers (as when a request brings another limit). The
-- reply ends with one entry per such record, in order: the length of the value applied (0: none)
-- as a double, then the value.

local function override(rec, name)
  local raw = redis.call('GET', name)
  local applied = false
  if raw then
    local size = #raw
    local untl, version, n, cap, code = 0, 0, 0, 0, 0
    if size >= 40 and size % 8 == 0 then
      untl, version, n, cap, code = struct.unpack('<ddddd', raw)
    end
    local expected = 0
    if code == 1 or code == 2 or code == 5 then
      expected = 7
    elseif code == 3 or code == 6 then
      expected = 4
    elseif code == 4 then
      expected = 3
    end
    if version ~= 1 or n ~= expected or size < 32 + 8 * n or rec.n ~= 1 then
      error('tollgate: the override key ' .. name .. ' holds no override this store can read')
    end
    local mode, cost = rec.mode, rec.cost
    if untl > now and (mode == 2 or cost <= cap) then
      local own = rec.c[1]
      local v = {}
      for i = 1, n do v[i] = struct.unpack('<d', raw, 25 + 8 * i) end
      -- The candidate read from the override's numbers, by the same code as the call's own.
      local saved, at = argv, a
      argv, a = v, 1
      local p = read()
      argv, a, k = saved, at, k - 1
      p.key = own.key
      if code == 1 then
        -- What the request's cost and mode change (params.rs, `push`); an override keeps an
        -- unbounded reservation's numbers, the only reservation an overridable rule makes.
        p.cost_span = min(cost * p.T, 2251799813685249)
        if mode ~= 2 then p.max_after, p.max_wait = 0, 0 end
      elseif code == 2 then
        if mode ~= 2 then p.owed, p.max_wait = 0, 0 end
      elseif code == 6 then
        p.lease, p.id = own.lease, own.id
      end
      rec.c[1] = p
      applied = raw
    end
  end
  if not tail then tail = {} end
  if applied then
    tail[#tail + 1] = struct.pack('<d', #applied) .. applied
  else
    tail[#tail + 1] = struct.pack('<d', 0)
  end
end
