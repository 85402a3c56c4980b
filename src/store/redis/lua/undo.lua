-- Undo: each record's earlier charge taken back exactly (a cross-slot batch that was denied in a
-- later slot, src/store/redis/mod.rs, `cross_slot`), from the candidate that charge chose (the
-- only one sent); each answers what its key has left after.
for _, rec in ipairs(records) do
  local p = fewest_left(rec)
  if rec.mode ~= 1 and p.stored ~= nil then
    -- A check wrote nothing; anything else is taken back, to the key's state before the
    -- charge. A key the charge created (there was none before), and that nothing else touched
    -- since, is removed again: a missing key is not the same as a stored fresh state, since a
    -- new key's state depends on when it is first seen (an initial balance below the
    -- capacity). A key that existed before keeps its undone state, even one equal to a fresh
    -- key's at that instant: a refund or a charge of 0 may have created it earlier at that instant,
    -- and from then on it refills.
    p.state = p.alg.undo(p, p.state, now, rec.cost, rec.aux, rec.at, rec.b1, rec.b2)
    local encoded = p.alg.encode(p.state)
    if rec.created == 1 and encoded == p.alg.encode(p.alg.fresh(p, rec.at)) then
      redis.call('DEL', p.key)
      p.missing = true
    else
      save(p, p.state)
      p.missing = false
    end
  end
  answer(rec, uncharged(p))
end
return finish()
