-- Refund (`Store::refund`): each record's cost given back to its candidate with the fewest
-- units left; each answers what its key has left after.
for _, rec in ipairs(records) do
  local p = fewest_left(rec)
  -- A token bucket that is not stored is full: nothing to give back.
  if p.stored ~= nil or p.code ~= 1 then
    p.state = p.alg.refund(p, p.state, now, rec.cost)
    save(p, p.state)
    p.missing = false
  end
  answer(rec, uncharged(p))
end
return finish()
